"""Hashes that protect without blocking.

- the trust-on-first-use record: a file seen once is held to its hash everywhere after;
- `--strict`: nothing without a lock (or given) hash;
- `greta lock --fill-hashes` against a local fake vendor index on 127.0.0.1;
- the vendor-index preflight: an unreachable vendor is named (DNS error) before any
  download, and files whose hash is known are fetched from the configured index instead.
"""

from __future__ import annotations

import hashlib
import json
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest
from _install_helpers import Index, make_wheel

from greta_install.install import hashrecord
from greta_install.install.installer import Downloader, InstallError, stage_plan
from greta_install.locks import lockgen
from greta_install.locks.matrix import parse_matrix
from greta_install.plan.install_plan import (
    HASH_RECORDED,
    HASH_TOFU,
    HASH_VERIFIED,
    InstallPlan,
    KernelWheel,
    PlannedPackage,
)

DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64


# --- the record -----------------------------------------------------------------------


def test_record_refuses_a_changed_file_and_roundtrips(tmp_path: Path) -> None:
    record = hashrecord.HashRecord(origin="test record")
    entry = hashrecord.Entry("torch", "2.14.1+rocm7.14", DIGEST_A, "https://vendor.test/whl")
    record.add("torch-2.14.1.whl", entry)
    assert record.check("torch-2.14.1.whl", DIGEST_A) == entry
    assert record.check("other.whl", DIGEST_B) is None  # unknown file: first use
    with pytest.raises(hashrecord.HashRecordError, match="the file changed since it was first"):
        record.check("torch-2.14.1.whl", DIGEST_B)
    path = tmp_path / "r.json"
    hashrecord.save_record(record, path)
    again = hashrecord.load_record(path)
    assert again.entries == record.entries
    conflicting = hashrecord.HashRecord(
        {"torch-2.14.1.whl": hashrecord.Entry("torch", "2.14.1", DIGEST_B, "x")}, "node 2"
    )
    with pytest.raises(hashrecord.HashRecordError, match="record different hashes"):
        record.merged(conflicting)
    assert hashrecord.load_record(tmp_path / "absent.json").entries == {}


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        json.dumps({"format": 99, "files": {}}),
        json.dumps({"format": 1, "files": {"../evil.whl": {"sha256": DIGEST_A}}}),
        json.dumps({"format": 1, "files": {"a.whl": {"sha256": "md5:00"}}}),
    ],
)
def test_garbled_records_are_refused(text: str) -> None:
    with pytest.raises(hashrecord.HashRecordError):
        hashrecord.parse_record(text, "garbled")


def _plan(packages: list[PlannedPackage], strict: bool = False) -> InstallPlan:
    return InstallPlan(
        target="cpu",
        arch=None,
        kernel_arch=None,
        python_version="3.12",
        python_executable=sys.executable,
        installer="pip",
        lock_file="x.txt",
        platform="x86_64-manylinux_2_28",
        packages=packages,
        kernel_wheel=KernelWheel(None, None, "none", None, None, "none"),
        env={},
        env_why={},
        warnings=[],
        allow_unverified=False,
        strict=strict,
    )


def test_strict_refuses_only_what_nobody_has_hashed() -> None:
    pkgs = [
        PlannedPackage("a", "1", None, (DIGEST_A,)),
        PlannedPackage("b", "1", "https://vendor.test", (), recorded=(DIGEST_B,)),
        PlannedPackage("c", "1", "https://vendor.test", ()),
    ]
    assert [p.hash_status for p in pkgs] == [HASH_VERIFIED, HASH_RECORDED, HASH_TOFU]
    assert _plan(pkgs).blockers == []
    strict = _plan(pkgs, strict=True).blockers
    assert len(strict) == 1 and strict[0].startswith("c==1: no hash in the lock")


# --- staging: TOFU check and vendor preflight ------------------------------------------

FAKE_PIP = textwrap.dedent(
    """
    import shutil, sys
    from pathlib import Path
    args = sys.argv[1:]
    dest = Path(args[args.index("--dest") + 1])
    req = Path(args[args.index("-r") + 1]).read_text().split()[0]
    name = req.split("==")[0].replace("-", "_")
    for wheel in Path(sys.argv[0]).parent.joinpath("wheels").glob(name + "-*.whl"):
        shutil.copy(wheel, dest / wheel.name)
    """
)


@pytest.fixture
def fake_pip(tmp_path: Path) -> Downloader:
    script = tmp_path / "fakepip" / "pip.py"
    (script.parent / "wheels").mkdir(parents=True)
    script.write_text(FAKE_PIP)
    return Downloader((sys.executable, str(script)))


def _wheel(fake: Downloader, name: str, kib: int = 1) -> str:
    filename, data = make_wheel(name, "1.0", kib)
    (Path(fake.base[1]).parent / "wheels" / filename).write_bytes(data)
    return "sha256:" + hashlib.sha256(data).hexdigest()


DOWN = "DNS lookup of vendor.test failed (Name or service not known)"


def test_unreachable_vendor_fails_before_any_download_naming_dns(
    fake_pip: Downloader, tmp_path: Path
) -> None:
    _wheel(fake_pip, "plain-pkg")
    _wheel(fake_pip, "vendor-pkg")
    plan = _plan(
        [
            PlannedPackage("plain-pkg", "1.0", None, ()),
            PlannedPackage("vendor-pkg", "1.0", "https://vendor.test/whl", ()),
        ]
    )
    stage = tmp_path / "stage"
    stage.mkdir()
    logged: list[str] = []
    with pytest.raises(InstallError) as err:
        stage_plan(plan, stage, fake_pip, logged.append, probe=lambda url: DOWN)
    assert err.value.package == "vendor-pkg" and DOWN in err.value.reason
    assert "Nothing was downloaded" in err.value.reason
    assert not any("staging" in line for line in logged)  # failed before the first download


def test_known_hash_is_fetched_without_the_dead_vendor_and_tofu_is_checked(
    fake_pip: Downloader, tmp_path: Path
) -> None:
    digest = _wheel(fake_pip, "vendor-pkg")
    stage = tmp_path / "stage"
    stage.mkdir()
    plan = _plan([PlannedPackage("vendor-pkg", "1.0", "https://vendor.test/whl", (digest,))])
    staged = stage_plan(plan, stage, fake_pip, lambda m: None, probe=lambda url: DOWN)
    assert staged.hashes["vendor-pkg"] == digest
    assert "--index-url" not in staged.commands[0]  # the dead vendor was not asked
    # The same file recorded earlier with another hash: refused at staging.
    record = hashrecord.HashRecord(
        {"vendor_pkg-1.0-py3-none-any.whl": hashrecord.Entry("vendor-pkg", "1.0", DIGEST_B, "x")},
        "the user's record",
    )
    tofu = _plan([PlannedPackage("vendor-pkg", "1.0", "https://vendor.test/whl", (), recorded=())])
    stage2 = tmp_path / "stage2"
    stage2.mkdir()
    with pytest.raises(InstallError, match="the file changed since it was first trusted"):
        stage_plan(tofu, stage2, fake_pip, lambda m: None, record=record, probe=lambda url: None)


# --- greta lock --fill-hashes against a local fake vendor index -------------------------

MATRIX = """
schema = 1
[lock]
exclude_newer = "2026-11-22T00:00:00Z"
platform = "x86_64-manylinux_2_28"
pythons = ["3.12"]

[targets.cpu]
hardware = "test"
kernel_wheel = false

[[targets.cpu.pins]]
name = "torch"
role = "torch"
version = "2.13.0+cpu"
index = "https://vendor.test/whl/cpu"
pythons = ["3.12"]
source = "test vendor"

[[targets.cpu.pins]]
name = "triton"
role = "triton"
version = "1.0"
index = "https://vendor.test/whl/cpu"
pythons = ["3.12"]
source = "test vendor (no hash on its page: downloaded and hashed)"

[[targets.cpu.pins]]
name = "jax"
role = "jax"
version = "1"
pythons = ["3.12"]
source = "x"
[[targets.cpu.pins]]
name = "jaxlib"
role = "jaxlib"
version = "1"
pythons = ["3.12"]
source = "x"
[[targets.cpu.pins]]
name = "numpy"
role = "numpy"
version = "1"
pythons = ["3.12"]
source = "x"

[[targets.mi300x.pins]]
name = "jax"
role = "jax"
version = "1"
pythons = ["3.12"]
source = "x"
"""


def test_fill_hashes_against_a_local_fake_vendor_index(tmp_path: Path) -> None:
    torch_name, torch_data = "torch-2.13.0+cpu-cp312-cp312-manylinux_2_28_x86_64.whl", b"T" * 999
    triton_name, triton_data = "triton-1.0-cp312-cp312-manylinux_2_28_x86_64.whl", b"R" * 777
    # The fake index serves the triton link without a #sha256 fragment, like PyTorch's.
    files = {torch_name: torch_data, triton_name: triton_data}
    matrix = parse_matrix(MATRIX.split("[[targets.mi300x.pins]]")[0] + _min_targets())
    with Index(files, {}) as index:
        base = index.url.rsplit("/simple/", 1)[0]

        def to_local(url: str) -> str:
            return url.replace("https://vendor.test/whl/cpu", base + "/simple")

        def fetch(url: str) -> str:
            with urllib.request.urlopen(to_local(url), timeout=10) as response:
                page = response.read().decode()
            # Drop the fragment of triton's link: no hash published for it.
            return page.replace(f"#sha256={hashlib.sha256(triton_data).hexdigest()}", "")

        downloads: list[str] = []

        def download(url: str) -> str:
            downloads.append(url)
            return lockgen.download_sha256(url.replace("https://vendor.test", base))

        filled = lockgen.fill_hashes(matrix, ["3.12"], fetch, download)
    got = {f.filename: f.sha256 for f in filled}
    assert got == {
        torch_name: "sha256:" + hashlib.sha256(torch_data).hexdigest(),
        triton_name: "sha256:" + hashlib.sha256(triton_data).hexdigest(),
    }
    assert len(downloads) == 1 and downloads[0].endswith(triton_name)  # only the unhashed one
    path = tmp_path / "hashes.toml"
    path.write_text(lockgen.format_hashes_file(filled, "2026-11-23T00:00:00Z"))
    loaded = lockgen.load_filled(path)
    assert loaded[("triton", "1.0", "3.12")] == (got[triton_name],)


def _min_targets() -> str:
    # The matrix needs the required targets; reuse the cpu row for the GPU ones.
    out = []
    for name in ("mi300x", "radeon", "cuda"):
        out.append(f"[targets.{name}]\nhardware = 'x'\nkernel_wheel = false\nsame_as = 'cpu'\n")
    return "\n".join(out)
