"""Write a GRETA kernel wheel: a plain zip with METADATA, WHEEL and a hashed RECORD.

Names: distribution ``greta-kernels-<arch>`` (``sm_90`` -> ``greta-kernels-sm-90``),
file ``greta_kernels_<arch>-<version>-py3-none-any.whl``, import package
``greta_kernels_<arch>`` holding ``configs.json``, ``manifest.json`` and ``precompiled/``.

The tag is ``py3-none-any`` on purpose: the wheel holds no host code. The device code
is only used when Triton computes the same cache key, and that key already includes
Triton's exact build (so a Python, platform or Triton mismatch is a clean miss, reported
by ``greta doctor``); the tuned config tables apply everywhere. A platform tag would
stop a user on another Python from getting the tuned tables at all.

Pure: no pip, no setuptools; the archive is reproducible (fixed timestamps, sorted).
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from collections.abc import Mapping
from pathlib import Path

from greta_core.errors import KernelWheelError
from greta_install.kernel_names import WHEEL_TAG, distribution_name, package_name, wheel_filename

# 1980-01-01, the zip epoch: identical inputs give byte-identical wheels.
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


def record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def metadata_text(arch: str, version: str, summary: str) -> str:
    return (
        "Metadata-Version: 2.1\n"
        f"Name: {distribution_name(arch)}\n"
        f"Version: {version}\n"
        f"Summary: {summary}\n"
        "License: Apache-2.0\n"
        f"Keywords: greta,triton,{arch}\n"
    )


def wheel_text() -> str:
    return (
        "Wheel-Version: 1.0\n"
        "Generator: greta_core.kernel_wheels.wheelbuild\n"
        "Root-Is-Purelib: true\n"
        f"Tag: {WHEEL_TAG}\n"
    )


def build_wheel(
    out_dir: Path,
    arch: str,
    version: str,
    package_files: Mapping[str, bytes],
    summary: str = "",
) -> Path:
    """Write the wheel; `package_files` maps paths inside the import package to bytes."""
    pkg = package_name(arch)
    dist_info = f"{pkg}-{version}.dist-info"
    summary = summary or f"GRETA precompiled Triton kernels and tuned launch configs for {arch}"
    entries: dict[str, bytes] = {}
    for rel, data in package_files.items():
        rel = rel.replace("\\", "/").lstrip("/")
        if not rel or ".." in rel.split("/"):
            raise KernelWheelError(f"bad path in kernel wheel: {rel!r}")
        entries[f"{pkg}/{rel}"] = data
    entries.setdefault(f"{pkg}/__init__.py", _init_text(arch).encode())
    entries[f"{dist_info}/METADATA"] = metadata_text(arch, version, summary).encode()
    entries[f"{dist_info}/WHEEL"] = wheel_text().encode()
    entries[f"{dist_info}/top_level.txt"] = f"{pkg}\n".encode()
    record_path = f"{dist_info}/RECORD"
    lines = [f"{name},{record_hash(data)},{len(data)}" for name, data in sorted(entries.items())]
    lines.append(f"{record_path},,")
    entries[record_path] = ("\n".join(lines) + "\n").encode()

    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / wheel_filename(arch, version)
    tmp = target.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        # RECORD last, as the wheel spec recommends.
        for name in sorted(entries, key=lambda n: (n == record_path, n)):
            info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, entries[name])
    tmp.replace(target)
    return target


def _init_text(arch: str) -> str:
    return (
        f'"""GRETA kernel wheel for {arch}: tuned configs and precompiled Triton code.\n\n'
        "Read by greta_core (configs.json, manifest.json, precompiled/); nothing to import.\n"
        '"""\n\n'
        f'ARCH = "{arch}"\n'
    )


def verify_record(wheel: Path) -> list[str]:
    """Problems with a wheel's RECORD (missing files, wrong hashes or sizes); [] when sound."""
    problems = []
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        records = [n for n in names if n.endswith(".dist-info/RECORD")]
        if len(records) != 1:
            return [f"{wheel.name}: expected one RECORD, found {len(records)}"]
        listed = set()
        for line in zf.read(records[0]).decode().splitlines():
            if not line.strip():
                continue
            name, digest, size = line.rsplit(",", 2)
            listed.add(name)
            if name == records[0]:
                continue
            if name not in names:
                problems.append(f"{name}: listed in RECORD but missing")
                continue
            data = zf.read(name)
            if digest != record_hash(data) or size != str(len(data)):
                problems.append(f"{name}: hash or size differs from RECORD")
        for name in sorted(names - listed):
            problems.append(f"{name}: in the wheel but not in RECORD")
    return problems
