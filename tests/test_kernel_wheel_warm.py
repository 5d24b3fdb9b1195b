"""The warm path holds an installed kernel wheel to the one kernel-wheel check (issue 30
item 5): `greta warm` (and the install's warm step) read and compile from the installed
wheel, which `pip install` by hand may have put there past every check. Now
`kernel_build.verify_installed` applies `verify_wheel`'s rules to the installed files and
`trust_installed` records its content on first use, like packages. The build cache: a
cached wheel built for another Triton, or whose hash differs from the one recorded when
it was built, is rebuilt, not installed (and not an install failure)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from io import BytesIO
from pathlib import Path
from types import SimpleNamespace

import pytest
from _install_helpers import REPO, make_kernel_wheel, make_wheel

from greta_install.environment import wheelfiles
from greta_install.install import hashrecord
from greta_install.install import kernel_build as kb

ARCH = "gfx942"
PKG = "greta_kernels_gfx942"
INFO = f"{PKG}-0.1.0.dist-info"


def _install(site: Path, wheel: tuple[str, bytes]) -> Path:
    """What an installer leaves: every member unpacked under `site` (RECORD as shipped)."""
    site.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(BytesIO(wheel[1])) as zf:
        zf.extractall(site)
    return site


def _rewrite(site: Path, member: str, data: bytes) -> None:
    """Change one installed file and its RECORD row consistently (a different build)."""
    (site / member).write_bytes(data)
    record = site / INFO / "RECORD"
    rows = [
        f"{member},{wheelfiles.record_digest(data)},{len(data)}"
        if r.startswith(f"{member},")
        else r
        for r in record.read_text().splitlines()
    ]
    record.write_text("\n".join(rows) + "\n")


def _good(**kw: object) -> tuple[str, bytes]:
    return make_kernel_wheel(ARCH, **kw)  # type: ignore[arg-type]


def test_a_good_installed_wheel_passes_with_a_stable_digest(tmp_path: Path) -> None:
    site = _install(tmp_path / "site", _good())
    first = kb.verify_installed(site, ARCH)
    assert first.manifest["arch"] == ARCH and first.dist_info.name == INFO
    # Bytecode Python writes when it imports the package is not the wheel's content.
    (site / PKG / "__pycache__").mkdir()
    (site / PKG / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"\0" * 16)
    assert kb.verify_installed(site, ARCH).digest == first.digest


def _bad_install(tmp_path: Path, case: str) -> Path:
    site = tmp_path / "site"
    if case == "root-pth":
        return _install(site, _good(extra={"zz_evil.pth": b"import os\n"}))
    if case == "package-pth":
        return _install(site, _good(extra={f"{PKG}/x.pth": b"import os\n"}))
    if case == "other-package":
        return _install(site, _good(extra={"torch/__init__.py": b""}))
    if case == "no-triton-version":
        return _install(site, _good(triton_version=None))
    if case == "other-arch":
        return _install(site, _good(manifest_arch="sm_90"))
    if case == "entry-points":
        return _install(site, _good(extra={f"{INFO}/entry_points.txt": b"[console_scripts]\n"}))
    _install(site, _good())
    if case == "tampered":  # a file changed after the install, RECORD not
        (site / PKG / "manifest.json").write_text(
            json.dumps({"arch": ARCH, "package": PKG, "kernels": [], "triton_version": "3.7.0"})
        )
    elif case == "planted-module":  # a file the wheel never had
        (site / PKG / "evil.py").write_text("import os\n")
    elif case == "missing-file":
        (site / PKG / "__init__.py").unlink()
    elif case == "symlink":
        (site / PKG / "link").symlink_to("/etc/hostname")
    elif case == "link-loop":  # a linked folder pointing back: refused, never walked
        (site / PKG / "loop").symlink_to(site / PKG, target_is_directory=True)
    elif case == "record-escapes":
        with open(site / INFO / "RECORD", "a") as fh:
            fh.write("../../../etc/cron.d/x,,\n")
    elif case == "two-dist-infos":
        (site / f"{PKG}-0.2.0.dist-info").mkdir()
        (site / f"{PKG}-0.2.0.dist-info" / "METADATA").write_text(
            "Metadata-Version: 2.1\nName: greta-kernels-gfx942\nVersion: 0.2.0\n"
        )
    elif case == "no-record":
        (site / INFO / "RECORD").unlink()
    return site


BAD = ["root-pth", "package-pth", "other-package", "no-triton-version", "other-arch",
       "entry-points", "tampered", "planted-module", "missing-file", "symlink", "link-loop",
       "record-escapes", "two-dist-infos", "no-record"]  # fmt: skip


@pytest.mark.parametrize("case", BAD)
def test_verify_installed_refuses_each_kind_of_bad_install(tmp_path: Path, case: str) -> None:
    site = _bad_install(tmp_path, case)
    with pytest.raises(kb.KernelWheelRefused, match="refused"):
        kb.verify_installed(site, ARCH)


def test_verify_installed_caps_the_unpacked_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = _install(tmp_path / "site", _good(extra={f"{PKG}/blob.bin": b"\0" * 4096}))
    monkeypatch.setattr(kb, "MAX_UNCOMPRESSED_BYTES", 2048)
    with pytest.raises(kb.KernelWheelRefused, match=r"over the 2048-byte limit"):
        kb.verify_installed(site, ARCH)


def test_an_installed_wheel_is_trusted_on_first_use(tmp_path: Path) -> None:
    site = _install(tmp_path / "site", _good())
    said: list[str] = []
    first = kb.trust_installed(site, ARCH, vouch=False, log=said.append)
    assert any(line.startswith("FIRST USE installed kernel wheel") for line in said)
    key = kb.INSTALLED_KEY.format(dist_info=INFO)
    record = hashrecord.load_record(hashrecord.env_record_path(site))
    assert record.entries[key].sha256 == first.digest
    assert kb.trust_installed(site, ARCH, vouch=False, log=said.append).digest == first.digest
    # Another build of the same name and version, RECORD consistent (pip install by hand):
    # refused, as a package whose file changed is.
    manifest = {"arch": ARCH, "package": PKG, "kernels": ["x"], "triton_version": "3.6.0"}
    _rewrite(site, f"{PKG}/manifest.json", json.dumps(manifest).encode())
    with pytest.raises(kb.KernelWheelRefused, match="changed since it was first trusted"):
        kb.trust_installed(site, ARCH, vouch=False, log=said.append)
    # GRETA installing it (after verify_wheel) vouches for the new content.
    again = kb.trust_installed(site, ARCH, vouch=True, log=said.append)
    assert again.digest != first.digest
    assert kb.trust_installed(site, ARCH, vouch=False, log=said.append).digest == again.digest


def _warm(site: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`python -m greta warm --json` with `site` on the path (where pip would have put it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRETA_")}
    env.update(PYTHONPATH=f"{REPO}{os.pathsep}{site}", GRETA_KERNEL_CACHE=str(tmp_path / "kc"))
    return subprocess.run(
        [sys.executable, "-m", "greta", "warm", "--json"], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def test_greta_warm_refuses_a_bad_installed_wheel_before_reading_it(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    site = _bad_install(tmp_path, "planted-module")
    proc = _warm(site, tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (row,) = json.loads(proc.stdout)
    assert row["ok"] is False and row["package"] == PKG
    assert row["error"].startswith("not warmed: the installed wheel is refused:")
    assert "evil.py is not in" in row["error"]
    assert not (tmp_path / "kc").exists()  # nothing built from it


def test_greta_warm_records_a_good_wheel_on_first_use(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    # Built for another Triton: verified and recorded, then skipped (its code is not used).
    site = _install(tmp_path / "site", _good(triton_version="0.0.1"))
    proc = _warm(site, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (row,) = json.loads(proc.stdout)
    assert row["ok"] is True and "wheel built for triton 0.0.1" in row["skipped"]
    assert "FIRST USE installed kernel wheel" in proc.stderr
    record = hashrecord.load_record(hashrecord.env_record_path(site))
    assert kb.INSTALLED_KEY.format(dist_info=INFO) in record.entries


# --- the build cache ------------------------------------------------------------------


def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cached: tuple[str, bytes]) -> Path:
    monkeypatch.setenv("GRETA_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GRETA_HASH_RECORD", str(tmp_path / "hashes.json"))
    monkeypatch.setattr(kb, "triton_fingerprint", lambda python: "f" * 32)
    entry = kb.cache_root() / kb.cache_key(ARCH, "f" * 32, kb.greta_source_hash())
    entry.mkdir(parents=True)
    (entry / cached[0]).write_bytes(cached[1])
    return entry


def _fresh_build(monkeypatch: pytest.MonkeyPatch, wheel: tuple[str, bytes]) -> list[int]:
    builds: list[int] = []

    def build(argv: list[str], *args: object) -> None:
        out = Path(argv[argv.index("--out") + 1])
        out.mkdir(parents=True)
        (out / wheel[0]).write_bytes(wheel[1])
        builds.append(1)

    monkeypatch.setattr(kb, "_run_with_progress", build)
    return builds


GOOD_F = {"triton_fingerprint": "f" * 32}


@pytest.mark.parametrize(
    ("cached", "locked"),
    [
        (_good(triton_fingerprint="e" * 32), None),  # built by another Triton build
        (_good(triton_version="3.5.0", triton_fingerprint="f" * 32), "3.6.0"),  # not the lock's
    ],
    ids=["other-triton-build", "other-than-the-lock"],
)
def test_a_cached_wheel_for_another_triton_is_rebuilt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cached: tuple[str, bytes], locked: str | None
) -> None:
    """The full install refused such a cached wheel (verify_kernel_wheel with the lock's
    Triton, after build_or_reuse) and failed instead of rebuilding it."""
    _cache(tmp_path, monkeypatch, cached)
    good = _good(**GOOD_F)
    builds = _fresh_build(monkeypatch, good)
    said: list[str] = []
    built = kb.build_or_reuse("python", ARCH, log=said.append, locked_triton=locked)
    assert builds == [1] and not built.cached and built.path.read_bytes() == good[1]
    assert any("rebuilding it" in line for line in said), said


def test_a_cached_wheel_whose_hash_changed_since_its_build_is_rebuilt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = _good(**GOOD_F)
    entry = _cache(tmp_path, monkeypatch, good)
    (entry / good[0]).unlink()
    builds = _fresh_build(monkeypatch, good)
    first = kb.build_or_reuse("python", ARCH, log=lambda m: None)  # built, hash recorded
    assert builds == [1] and not first.cached
    assert kb.build_or_reuse("python", ARCH, log=lambda m: None).cached  # reused as recorded
    # Swapped for another wheel that passes every content check: refused by its hash.
    other = _good(extra={f"{PKG}/more.json": b"{}"}, **GOOD_F)
    first.path.write_bytes(other[1])
    said: list[str] = []
    again = kb.build_or_reuse("python", ARCH, log=said.append)
    assert builds == [1, 1] and not again.cached and again.path.read_bytes() == good[1]
    assert any("changed since it was first trusted" in line for line in said), said


def test_the_install_step_builds_for_the_locked_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    from greta_install.install import step_kernels

    seen: dict[str, object] = {}

    def fake(python: str, arch: str, **kw: object) -> kb.BuiltWheel:
        seen.update(kw, arch=arch)
        raise kb.KernelBuildError("stop here")

    monkeypatch.setattr(kb, "build_or_reuse", fake)
    plan = SimpleNamespace(
        kernel_wheel=SimpleNamespace(arch=ARCH),
        packages=[SimpleNamespace(name="numpy", version="2.0"),
                  SimpleNamespace(name="pytorch-triton-rocm", version="3.6.0")],
    )  # fmt: skip
    ctx = SimpleNamespace(plan=plan, executable="python", log=lambda m: None, results={})
    with pytest.raises(step_kernels.StepFailed, match="stop here"):
        step_kernels.KernelBuild().run(ctx)  # type: ignore[arg-type]
    assert seen["arch"] == ARCH and seen["locked_triton"] == "3.6.0"


def test_the_install_vouches_only_for_a_kernel_wheel_it_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The warm step records the installed content only when this run installed the wheel
    (found on a source, or built); a wheel left there from before is left to `greta warm`."""
    from greta_install.install import steps

    vouched: list[Path] = []
    monkeypatch.setattr(kb, "trust_installed", lambda site, arch, **kw: vouched.append(site))

    def ctx(status: str, results: dict[str, object]) -> SimpleNamespace:
        plan = SimpleNamespace(kernel_wheel=SimpleNamespace(arch=ARCH, status=status))
        done = SimpleNamespace(returncode=0, stdout="", stderr="")
        return SimpleNamespace(
            plan=plan, results=results, site_packages=tmp_path, log=lambda m: None,
            python=lambda argv, timeout: done, executable="python",
        )  # fmt: skip

    steps.WarmLaunchers().run(ctx("build", {}))  # the build step failed: nothing installed
    assert vouched == []
    steps.WarmLaunchers().run(ctx("build", {"kernel-build": {"wheel": "w"}}))
    steps.WarmLaunchers().run(ctx("found", {}))
    assert vouched == [tmp_path, tmp_path]


def test_a_wheel_without_a_package_is_not_an_installed_kernel_wheel(tmp_path: Path) -> None:
    site = _install(tmp_path / "site", make_wheel("greta-kernels-gfx942", "0.1.0", extra={}))
    with pytest.raises(kb.KernelWheelRefused, match="manifest"):
        kb.verify_installed(site, ARCH)


# --- loading at run time ------------------------------------------------------------------


def test_recorded_state_reads_the_record_cheaply(tmp_path: Path) -> None:
    site = _install(tmp_path / "site", _good())
    assert kb.recorded_state(site, ARCH) == "unrecorded"
    kb.trust_installed(site, ARCH, vouch=False, log=lambda m: None)
    assert kb.recorded_state(site, ARCH) == "matches"
    manifest = {"arch": ARCH, "package": PKG, "kernels": ["x"], "triton_version": "3.6.0"}
    _rewrite(site, f"{PKG}/manifest.json", json.dumps(manifest).encode())
    assert kb.recorded_state(site, ARCH) == "differs"


STATUS = (
    "import json; from greta_core.kernel_wheels import precompiled; "
    "print(json.dumps({r['arch']: r['why_not'] for r in precompiled.status()}))"
)


def test_the_runtime_does_not_load_a_wheel_changed_since_it_was_verified(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    site = _install(tmp_path / "site", _good(triton_version="0.0.1"))
    kb.trust_installed(site, ARCH, vouch=False, log=lambda m: None)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRETA_")}
    env.update(PYTHONPATH=f"{REPO}{os.pathsep}{site}", TRITON_INTERPRET="0")

    def why_not() -> str:
        proc = subprocess.run(
            [sys.executable, "-c", STATUS], cwd=tmp_path, env=env, capture_output=True,
            text=True, timeout=300, check=True,
        )  # fmt: skip
        return json.loads(proc.stdout.strip().splitlines()[-1])[ARCH]

    assert why_not().startswith("built for triton 0.0.1")  # past the record, then its Triton
    manifest = {"arch": ARCH, "package": PKG, "kernels": ["x"], "triton_version": "0.0.1"}
    _rewrite(site, f"{PKG}/manifest.json", json.dumps(manifest).encode())
    assert why_not() == "changed since it was verified: run `greta warm` to check it again"


def test_greta_kernels_and_install_only_vouch_for_what_they_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`install_wheel(..., arch=)` records the installed content; both commands pass it."""
    import argparse

    from greta_install.commands import kernels
    from greta_install.environment import tools
    from greta_install.install import only as install_only

    site = _install(tmp_path / "site", _good())
    wheel = tmp_path / _good()[0]
    wheel.write_bytes(_good()[1])
    done = subprocess.CompletedProcess([], 0, "", "")
    monkeypatch.setattr(kb.subprocess, "run", lambda *a, **k: done)  # pip "installed" it
    monkeypatch.setattr(tools, "site_packages_of", lambda python: site)
    kb.install_wheel("python", wheel, log=lambda m: None, arch=ARCH)
    entry = hashrecord.load_record(hashrecord.env_record_path(site)).entries[
        kb.INSTALLED_KEY.format(dist_info=INFO)
    ]
    assert entry.recorded_by == "greta install"
    assert entry.sha256 == kb.verify_installed(site, ARCH).digest

    calls: list[dict[str, object]] = []
    built = kb.BuiltWheel(wheel, ARCH, "0" * 64, True, 0.0)
    monkeypatch.setattr(kb, "build_or_reuse", lambda *a, **k: built)
    monkeypatch.setattr(kb, "install_wheel", lambda *a, **k: calls.append(k))
    monkeypatch.setattr(install_only, "_warm", lambda python, log: True)
    monkeypatch.setattr(install_only, "_has_pip", lambda python: True)
    args = dict(python="python", arch=ARCH, index=None, no_install=False, no_cache=False, jobs=0)
    assert kernels.run(argparse.Namespace(**args)) == 0
    only = dict(only="kernels", python="python", target="mi300x", arch=ARCH, snapshot=None,
                json=False, no_build_kernels=False)  # fmt: skip
    assert install_only.run(argparse.Namespace(**only)) == 0
    assert [c.get("arch") for c in calls] == [ARCH, ARCH]
