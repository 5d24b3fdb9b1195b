"""One kernel-wheel check on every path that installs one (issue 30 item 5).

`kernel_build.verify_wheel` is the check; the full install (`installer.verify_kernel_wheel`),
`greta install --only kernels` and `greta kernels` (both through `build_or_reuse`) and the
build cache all go through it. A cached wheel that fails it is rebuilt, never installed."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import zipfile
from pathlib import Path

import pytest
from _install_helpers import make_kernel_wheel, make_wheel

from greta_install.install import kernel_build as kb

ARCH = "gfx942"
PKG = "greta_kernels_gfx942"


def _variants() -> dict[str, tuple[str, bytes]]:
    manifest = {"arch": ARCH, "package": PKG, "kernels": [], "triton_version": "3.6.0"}
    return {
        "root-pth": make_kernel_wheel(ARCH, extra={"zz_evil.pth": b"import os\n"}),
        "package-pth": make_kernel_wheel(ARCH, extra={f"{PKG}/x.pth": b"import os\n"}),
        "other-package": make_kernel_wheel(ARCH, extra={"torch/__init__.py": b""}),
        "data-dir": make_kernel_wheel(ARCH, extra={f"{PKG}-0.1.0.data/scripts/x": b""}),
        "no-triton-version": make_kernel_wheel(ARCH, triton_version=None),
        "bad-triton-version": make_kernel_wheel(ARCH, triton_version="not a version"),
        "other-arch": make_kernel_wheel(ARCH, manifest_arch="sm_90"),
        "no-manifest": make_wheel("greta-kernels-gfx942", "0.1.0", extra={f"{PKG}/a.py": b""}),
        "manifest-not-object": make_wheel(
            "greta-kernels-gfx942", "0.1.0", extra={f"{PKG}/manifest.json": b"[1]"}
        ),
        "deep-manifest": make_wheel(
            "greta-kernels-gfx942",
            "0.1.0",
            extra={f"{PKG}/manifest.json": b"[" * 100_000 + b"]" * 100_000},
        ),
        "record-mismatch": _tamper(
            make_kernel_wheel(ARCH),
            f"{PKG}/manifest.json",
            json.dumps({**manifest, "arch": ARCH, "x": 1}).encode(),
        ),
    }


def _tamper(wheel: tuple[str, bytes], member: str, data: bytes) -> tuple[str, bytes]:
    """The wheel with one member's bytes replaced, its RECORD left as it was."""
    name, raw = wheel
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(raw)) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            dst.writestr(info.filename, data if info.filename == member else src.read(info))
    return name, out.getvalue()


def _bomb(path: Path) -> None:
    """A small wheel that unpacks past the cap (zeros compress ~1000:1)."""
    _, raw = make_kernel_wheel(ARCH)
    with (
        zipfile.ZipFile(io.BytesIO(raw)) as src,
        zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as dst,
    ):
        digest = hashlib.sha256()
        for info in src.infolist():
            if not info.filename.endswith("RECORD"):
                dst.writestr(info.filename, src.read(info))
        chunk = b"\0" * (1 << 20)
        with dst.open(f"{PKG}/zeros.bin", "w", force_zip64=True) as fh:
            for _ in range(kb.MAX_UNCOMPRESSED_BYTES // len(chunk) + 1):
                fh.write(chunk)
                digest.update(chunk)
        record = src.read("greta_kernels_gfx942-0.1.0.dist-info/RECORD").decode()
        b64 = base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()
        size = (kb.MAX_UNCOMPRESSED_BYTES // len(chunk) + 1) * len(chunk)
        dst.writestr(
            "greta_kernels_gfx942-0.1.0.dist-info/RECORD",
            record + f"{PKG}/zeros.bin,sha256={b64},{size}\n",
        )


@pytest.mark.parametrize("case", list(_variants()))
def test_verify_refuses_each_kind_of_bad_wheel(tmp_path: Path, case: str) -> None:
    name, data = _variants()[case]
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(kb.KernelWheelRefused, match="refused"):
        kb.verify_wheel(path, ARCH)


def test_verify_refuses_a_zip_bomb_before_reading_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cap is read from the archive's directory, before any member is inflated (a
    smaller cap here keeps the test quick; the real one is 512 MiB)."""
    monkeypatch.setattr(kb, "MAX_UNCOMPRESSED_BYTES", 16 * 1024 * 1024)
    path = tmp_path / "greta_kernels_gfx942-0.1.0-py3-none-any.whl"
    _bomb(path)
    assert path.stat().st_size < 1024 * 1024
    with pytest.raises(kb.KernelWheelRefused, match=r"over the \d+-byte limit"):
        kb.verify_wheel(path, ARCH)


def test_verify_accepts_a_good_wheel_and_checks_the_locked_triton(tmp_path: Path) -> None:
    name, data = make_kernel_wheel(ARCH, triton_version="3.6.0")
    path = tmp_path / name
    path.write_bytes(data)
    assert kb.verify_wheel(path, ARCH, "3.6.0")["arch"] == ARCH
    with pytest.raises(kb.KernelWheelRefused, match=r"built with Triton 3\.6\.0"):
        kb.verify_wheel(path, ARCH, "3.8.0")


@pytest.mark.parametrize("case", ["root-pth", "no-triton-version", "record-mismatch"])
def test_a_cached_wheel_that_fails_the_check_is_rebuilt_not_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """The path of `greta kernels` and `greta install --only kernels` (build_or_reuse): a
    cached wheel with a `.pth` at its root ran at the next Python start; the full install
    refused it and then failed instead of rebuilding."""
    monkeypatch.setenv("GRETA_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GRETA_HASH_RECORD", str(tmp_path / "hashes.json"))
    monkeypatch.setattr(kb, "triton_fingerprint", lambda python: "f" * 32)
    entry = kb.cache_root() / kb.cache_key(ARCH, "f" * 32, kb.greta_source_hash())
    entry.mkdir(parents=True)
    name, evil = _variants()[case]
    (entry / name).write_bytes(evil)
    good_name, good = make_kernel_wheel(ARCH, triton_fingerprint="f" * 32)

    def build(argv: list[str], *args: object) -> None:
        out = Path(argv[argv.index("--out") + 1])
        out.mkdir(parents=True)
        (out / good_name).write_bytes(good)

    monkeypatch.setattr(kb, "_run_with_progress", build)
    logged: list[str] = []
    built = kb.build_or_reuse("python", ARCH, log=logged.append)
    assert not built.cached and built.path.read_bytes() == good
    assert any("rebuilding it" in line for line in logged), logged
    assert all(p.read_bytes() != evil for p in entry.parent.rglob("*.whl"))


def test_a_fresh_build_that_fails_the_check_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GRETA_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GRETA_HASH_RECORD", str(tmp_path / "hashes.json"))
    monkeypatch.setattr(kb, "triton_fingerprint", lambda python: "f" * 32)
    name, evil = _variants()["root-pth"]

    def build(argv: list[str], *args: object) -> None:
        out = Path(argv[argv.index("--out") + 1])
        out.mkdir(parents=True)
        (out / name).write_bytes(evil)

    monkeypatch.setattr(kb, "_run_with_progress", build)
    with pytest.raises(kb.KernelBuildError, match=r"zz_evil\.pth"):
        kb.build_or_reuse("python", ARCH, log=lambda m: None)
    assert not list((tmp_path / "cache").rglob("*.whl"))


def test_a_folder_with_sha256sums_serves_only_what_it_lists(tmp_path: Path) -> None:
    """A wheel with a build tag that SHA256SUMS does not list was chosen."""
    from greta_install.install.installer import find_kernel_wheel

    name, data = make_kernel_wheel(ARCH)
    tagged = name.replace("-0.1.0-", "-0.1.0-1zz-")
    (tmp_path / name).write_bytes(data)
    (tmp_path / tagged).write_bytes(data + b"")
    (tmp_path / "SHA256SUMS").write_text(f"{hashlib.sha256(data).hexdigest()}  {name}\n")
    found = find_kernel_wheel(str(tmp_path), "greta-kernels-gfx942==0.1.0")
    assert found.location == str(tmp_path / name)
    (tmp_path / name).unlink()
    refused = find_kernel_wheel(str(tmp_path), "greta-kernels-gfx942==0.1.0")
    assert refused.location is None and "not listed in its SHA256SUMS" in (refused.problem or "")
