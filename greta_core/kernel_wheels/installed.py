"""What `greta doctor` needs to know about the installed GRETA kernel wheel.

Stdlib only and no triton import: the doctor passes the device arch and the installed
triton version (it reads them itself, e.g. from importlib.metadata and detection).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from greta_install.kernel_names import distribution_name, package_name, wheel_archs


@dataclass(frozen=True)
class KernelWheelInfo:
    arch: str
    distribution: str
    version: str  # the installed distribution's version ("" when metadata is missing)
    path: Path  # the import package directory
    manifest: dict[str, Any] = field(default_factory=dict)

    @property
    def triton_version(self) -> str:
        return str(self.manifest.get("triton_version", ""))

    @property
    def kernel_count(self) -> int:
        return len(self.manifest.get("kernels", []))


@dataclass(frozen=True)
class Problem:
    id: str  # "kernel-wheel-missing" | "kernel-wheel-arch" | "kernel-wheel-triton" | ...
    status: str  # "warn" | "fail"
    finding: str
    fix: str


def _info(arch: str) -> KernelWheelInfo | None:
    try:
        spec = importlib.util.find_spec(package_name(arch))
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations)))
    try:
        manifest = json.loads((path / "manifest.json").read_text())
        if not isinstance(manifest, dict):
            manifest = {}
    except (OSError, ValueError):
        manifest = {}
    try:
        version = importlib.metadata.version(distribution_name(arch))
    except importlib.metadata.PackageNotFoundError:
        version = ""
    return KernelWheelInfo(arch, distribution_name(arch), version, path, manifest)


def installed_kernel_wheels() -> list[KernelWheelInfo]:
    return [info for arch in wheel_archs() if (info := _info(arch)) is not None]


def installed_kernel_wheel() -> KernelWheelInfo | None:
    """The installed GRETA kernel wheel (the first, when several are), or None."""
    wheels = installed_kernel_wheels()
    return wheels[0] if wheels else None


def describe(wheel: KernelWheelInfo, triton_version: str | None) -> str:
    """One line for the doctor: the wheel, its arch, its Triton fingerprint, and whether its
    code is in use with the installed Triton (the runtime serves a wheel's code only to the
    Triton version it was built with: greta_core.kernel_wheels.precompiled)."""
    fingerprint = str(wheel.manifest.get("triton_fingerprint", ""))[:12] or "unknown"
    built = wheel.triton_version or "unknown"
    head = (
        f"{wheel.distribution} {wheel.version} for {wheel.manifest.get('arch', wheel.arch)}, "
        f"{wheel.kernel_count} kernels, Triton {built} (fingerprint {fingerprint})"
    )
    if not triton_version:
        return f"{head}: whether its code is in use is unknown (Triton not importable)"
    if built != triton_version:
        return f"{head}: its code is NOT in use (installed Triton is {triton_version})"
    return f"{head}: its code is in use"


def _launchers_built(wheel: KernelWheelInfo) -> bool:
    from greta_core.kernel_wheels.host_launchers import is_warm

    try:
        return is_warm(wheel.manifest)
    except Exception:  # an unreadable cache is reported as not built
        return False


def check_kernel_wheel(
    arch: str | None,
    triton_version: str | None,
    wheels: list[KernelWheelInfo] | None = None,
) -> list[Problem]:
    """Problems with the kernel wheel for a device of `arch` and an installed triton.

    `arch` None (no GPU) or an arch GRETA ships no wheel for -> nothing to check.
    Pure given `wheels` (the doctor tests pass fabricated ones).
    """
    if wheels is None:
        wheels = installed_kernel_wheels()
    if not arch or arch not in wheel_archs():
        return []
    install = "greta install   # installs the kernel wheel for the detected arch"
    problems: list[Problem] = []
    match = next((w for w in wheels if w.arch == arch), None)
    others = [w for w in wheels if w.arch != arch]
    if match is None:
        if others:
            names = ", ".join(w.distribution for w in others)
            problems.append(
                Problem(
                    "kernel-wheel-arch",
                    "warn",
                    f"kernel wheel for another arch installed ({names}); this GPU is {arch}",
                    f"pip uninstall -y {' '.join(w.distribution for w in others)} && {install}",
                )
            )
        else:
            problems.append(
                Problem(
                    "kernel-wheel-missing",
                    "warn",
                    f"no GRETA kernel wheel for {arch}: kernels compile on first use and "
                    "the built-in launch configs apply",
                    install,
                )
            )
        return problems
    if not match.manifest:
        problems.append(
            Problem(
                "kernel-wheel-broken",
                "fail",
                f"{match.distribution} has no readable manifest.json",
                f"pip install --force-reinstall {match.distribution}",
            )
        )
        return problems
    if match.manifest.get("arch") != arch:
        problems.append(
            Problem(
                "kernel-wheel-arch",
                "fail",
                f"{match.distribution} holds code for {match.manifest.get('arch')!r}, not {arch}",
                f"pip install --force-reinstall {match.distribution}",
            )
        )
    built = match.triton_version
    if triton_version and built and built != triton_version:
        problems.append(
            Problem(
                "kernel-wheel-triton",
                "warn",
                f"{match.distribution} was built for triton {built}, installed triton is "
                f"{triton_version}: its precompiled kernels are not used (tuned configs are)",
                f"greta build-kernels --arch {arch} --out wheels && "
                f"pip install --force-reinstall --no-deps wheels/{package_name(arch)}-*.whl",
            )
        )
    elif not _launchers_built(match):
        problems.append(
            Problem(
                "kernel-wheel-launchers",
                "warn",
                f"{match.distribution}: Triton's host launchers are not built for this "
                "Python: each kernel's first call runs the C compiler",
                "greta warm",
            )
        )
    if others:
        problems.append(
            Problem(
                "kernel-wheel-extra",
                "warn",
                "kernel wheels for other archs also installed: "
                + ", ".join(w.distribution for w in others),
                f"pip uninstall -y {' '.join(w.distribution for w in others)}",
            )
        )
    return problems
