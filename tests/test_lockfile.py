"""Lock files: format round trip, the committed locks' invariants, freshness."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from greta_install.locks import docsgen, lockgen
from greta_install.locks.lockfile import (
    Lock,
    LockedPackage,
    LockError,
    available_locks,
    format_lock,
    load_lock,
    parse_lock,
)
from greta_install.locks.matrix import load_matrix

REPO = Path(__file__).resolve().parent.parent
TARGETS_DIR = REPO / "lock" / "targets"
LOCK_FILES = sorted(TARGETS_DIR.glob("*.txt"))
H1 = "sha256:" + "a" * 64
H2 = "sha256:" + "b" * 64


def sample_lock() -> Lock:
    return Lock(
        target="radeon",
        python="3.12",
        packages=(
            LockedPackage("numpy", "2.4.6", None, (H1, H2)),
            LockedPackage(
                "torch", "2.11.0+rocm7.2", "https://download.pytorch.org/whl/rocm7.2", ()
            ),
            LockedPackage("typing-extensions", "4.16.0", None, (H1,), 'python_version < "3.13"'),
        ),
        kernel_wheel="greta-kernels-gfx1100==0.1.0",
        env={"HSA_OVERRIDE_GFX_VERSION": "11.0.0", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
        meta={"target": "radeon", "python": "3.12", "platform": "x86_64-manylinux_2_28"},
    )


def test_round_trip() -> None:
    lock = sample_lock()
    text = format_lock(lock, {"torch": "greta: vendor index unreachable"})
    again = parse_lock(text)
    assert again == lock
    assert again.meta["platform"] == "x86_64-manylinux_2_28"
    assert format_lock(again, {"torch": "greta: vendor index unreachable"}) == text
    assert not again.package("torch").verified
    assert again.package("NumPy").verified
    assert "--extra-index-url https://download.pytorch.org/whl/rocm7.2" in text


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda t: t.replace("numpy==2.4.6", "numpy>=2.4"), "pinned with =="),
        (lambda t: t.replace(H1, "sha256:xyz", 1), "malformed hash"),
        (
            lambda t: t.replace(
                "# greta: unverified: no hash could be obtained where this lock was made\n", ""
            ),
            "no hash and is not marked",
        ),
        (
            lambda t: t.replace("--extra-index-url https://download.pytorch.org/whl/rocm7.2\n", ""),
            "no --extra-index-url line",
        ),
        (lambda t: t.replace("# greta-target: radeon\n", ""), "not a GRETA lock file"),
        (lambda t: t + "numpy==2.4.6 --hash=" + H1 + "\n", "appears twice"),
        (
            lambda t: t.replace(
                "# greta-env: HSA_OVERRIDE_GFX_VERSION=11.0.0", "# greta-env: =oops"
            ),
            "malformed environment",
        ),
        (lambda t: t + "-e ./somewhere\n", "unexpected option"),
    ],
)
def test_corrupt_lock_is_a_clear_error(mutate, message: str) -> None:
    text = mutate(format_lock(sample_lock()))
    with pytest.raises(LockError, match=message):
        parse_lock(text, origin="x.txt")


def test_load_lock_errors_name_the_problem() -> None:
    with pytest.raises(LockError, match="no lock for target 'nonesuch'"):
        load_lock("nonesuch", "3.12")
    with pytest.raises(LockError, match="Available: "):
        load_lock("cpu", "3.9")


def test_every_matrix_row_has_a_committed_lock() -> None:
    matrix = load_matrix()
    have = set(available_locks())
    spec_archs = {name: spec.archs for name, spec in matrix.targets.items()}
    for row in matrix.rows():
        assert (row.target, row.python) in have
        lock = load_lock(row.target, row.python, row.generation)
        assert lock.target == row.target and lock.python == row.python
        assert lock.meta["row"] == row.generation
        for pin in row.pins:
            names = (
                [pin.for_arch(a) for a in spec_archs[row.target]] if pin.per_arch else [pin.name]
            )
            for name in names:
                locked = lock.package(name)
                assert locked is not None and locked.version == pin.version, name
                assert locked.index == pin.index


@pytest.mark.parametrize("path", LOCK_FILES, ids=[p.name for p in LOCK_FILES])
def test_committed_lock_invariants(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    lock = parse_lock(text, origin=path.name)
    hosts = set(re.findall(r"https?://([^/\s]+)", text))
    # The default index is never named: only the vendor indexes appear.
    vendors = {"download.pytorch.org", "repo.radeon.com", "repo.amd.com"}
    assert hosts <= vendors, hosts
    for url in lock.vendor_indexes:
        assert url.startswith(
            (
                "https://download.pytorch.org/whl/",
                "https://repo.radeon.com/",
                "https://repo.amd.com/",
            )
        )
    for pkg in lock.packages:
        if pkg.index is None:
            assert pkg.verified, f"{pkg.name}: a default-index pin must carry its sha256"
        if not pkg.verified:
            block = text.split(f"\n{pkg.name}=={pkg.version}")[0].rsplit("\n\n", 1)[-1]
            assert "# greta: unverified" in block.splitlines()[-1]
    assert text.startswith("# Generated by `greta lock`")
    # No local path of the machine that made it (find-links copies, caches).
    assert not re.search(r"(^|[\s=])/[A-Za-z]", text, re.MULTILINE)
    assert "file:" not in text


def test_cpu_py311_torch_is_the_local_verified_build() -> None:
    lock = load_lock("cpu", "3.11")
    torch = lock.package("torch")
    assert torch.version == "2.13.0+cpu"
    assert torch.index == "https://download.pytorch.org/whl/cpu"
    assert torch.hashes == (
        "sha256:6746dbcbeb526eb61330b76b41ff1b4eb848951103a892eeb080dfa2b264667b",
    )


def test_committed_locks_and_docs_are_fresh() -> None:
    matrix = load_matrix()
    assert lockgen.stale_locks(matrix, TARGETS_DIR) == []
    for lang in docsgen.LANGUAGES:
        committed = (REPO / "docs" / lang / "framework_versions.md").read_text(encoding="utf-8")
        assert committed == docsgen.render(matrix, lang), (
            f"docs/{lang}/framework_versions.md: run `greta lock`"
        )


def test_fingerprint_changes_with_a_pin() -> None:
    matrix = load_matrix()
    row = matrix.row("cuda", "3.12")
    spec = matrix.target("cuda")
    before = lockgen.fingerprint(row, spec, matrix, "0.1.0")
    assert lockgen.fingerprint(row, spec, matrix, "0.2.0") != before
    from dataclasses import replace

    changed = replace(
        row, pins=tuple(replace(p, version="3.6.1") if p.name == "triton" else p for p in row.pins)
    )
    assert lockgen.fingerprint(changed, spec, matrix, "0.1.0") != before


def test_resolver_input_leaves_out_what_a_vendor_pin_provides() -> None:
    matrix = load_matrix()
    lines, no_emit = lockgen.resolver_input(matrix.row("mi300x", "3.12"))
    assert "triton==3.8.0" in lines and no_emit == ["triton"]
    assert not any(line.startswith(("torch", "triton-rocm", "rocm")) for line in lines)
    assert "setuptools>=77.0.3" in lines  # torch's own dependency, from the default index
    old, _ = lockgen.resolver_input(matrix.row("mi300x", "3.12", "previous"))
    assert "triton==3.6.0" in old and "setuptools<82" in old


def test_vendor_hash_from_a_simple_index_page() -> None:
    matrix = load_matrix()
    pin = next(p for p in matrix.row("mi300x", "3.12", "previous").pins if p.name == "torch")
    page = (
        '<a href="torch-2.11.0%2Brocm7.2-cp312-cp312-manylinux_2_28_x86_64.whl#sha256='
        + "c" * 64
        + '">x</a>'
        '<a href="torch-2.11.0%2Brocm7.2-cp311-cp311-manylinux_2_28_x86_64.whl#sha256='
        + "d"
        * 64
        + '">x</a>'
        '<a href="torch-2.10.0%2Brocm7.2-cp312-cp312-manylinux_2_28_x86_64.whl#sha256='
        + "e" * 64
        + '">x</a>'
    )
    tags = lockgen.target_tags("3.12", "x86_64-manylinux_2_28")
    assert lockgen.hashes_from_simple_index(pin.index, pin, tags, fetch=lambda url: page) == (
        "sha256:" + "c" * 64,
    )


def test_lock_check_command_passes_on_the_committed_tree() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "greta", "lock", "--check", "--repo", str(REPO)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "up to date" in proc.stdout


@pytest.mark.network
@pytest.mark.slow
def test_fresh_resolution_matches_a_committed_lock() -> None:
    from greta_install.environment.tools import find_uv

    uv = find_uv()
    if uv is None:
        pytest.skip("uv not installed")
    matrix = load_matrix()
    try:
        made = lockgen.generate_row(matrix, "cuda", "3.12", uv)
    except lockgen.LockGenError as exc:
        if (
            "network" in str(exc).lower()
            or "connect" in str(exc).lower()
            or "dns" in str(exc).lower()
        ):
            pytest.skip(f"default index unreachable: {exc}")
        raise
    assert made.text == (TARGETS_DIR / "cuda-py312.txt").read_text(encoding="utf-8")
