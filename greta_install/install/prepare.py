"""The plan step of `greta install`: gather facts at the edge, then build the pure plan.

Reads the matrix and the lock, runs detection (or reads a snapshot), asks the target
interpreter its version, finds the installer and looks for the kernel wheel. Changes
nothing; every refusal is an `InstallFailed` with exit status 2.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from typing import Any

from greta_install import commandline
from greta_install.boundedio import LOCK_MAX_BYTES, read_text
from greta_install.environment.tools import find_uv, has_pip, python_version_of
from greta_install.install import installer as inst
from greta_install.install.pipeline import InstallFailed, InstallRequest, Prepared
from greta_install.install.steps import steps_for
from greta_install.locks import routing
from greta_install.locks.lockfile import Lock, LockError, load_lock, parse_lock
from greta_install.locks.matrix import Matrix, MatrixError, load_matrix
from greta_install.plan import install_plan as planning


def _detect(snapshot: str | None) -> tuple[Any, str | None]:
    """Detection of this machine (or a snapshot); (None, why) when it is unavailable."""
    try:
        from greta_install.detection.detect import detect
        from greta_install.detection.system_view import open_view
    except ImportError:
        return None, "detection is not available in this build"
    try:
        return detect(open_view(snapshot)), None
    except FileNotFoundError as exc:
        return None, str(exc)
    except Exception as exc:  # detection must never take the installer down
        return None, f"detection failed ({exc.__class__.__name__}: {exc})"


def _interpreter(request: InstallRequest) -> tuple[str | None, str]:
    if (
        request.python
        and re.fullmatch(r"3\.\d+", request.python)
        and not os.path.exists(request.python)
    ):
        if not request.dry_run:
            raise InstallFailed(
                "a real install needs --python PATH to an interpreter (a version only plans)", 2
            )
        return None, request.python
    executable = request.python or sys.executable
    try:
        return executable, python_version_of(executable)
    except ValueError as exc:
        raise InstallFailed(str(exc), 2) from None


def _explicit_lock(path: str) -> Lock:
    try:
        text = read_text(path, LOCK_MAX_BYTES)
    except (OSError, UnicodeDecodeError) as exc:
        raise InstallFailed(f"cannot read lock file {path}: {exc}", 2) from None
    try:
        return parse_lock(text, origin=path, check_header=True)
    except LockError as exc:
        raise InstallFailed(str(exc), 2) from None


def _check_machine(target: str, detection: Any, request: InstallRequest) -> None:
    """A lock or --target made for another kind of machine is refused unless forced
    (an mi300x set on a CPU machine installs, then fails at the first GPU call)."""
    if foreign_target(target, detection, request) and not request.dry_run:
        what = f"{request.lock} is the lock of" if request.lock else "--target"
        raise InstallFailed(
            f"{what} {target} but this machine is {detection.target}; pass --force-target "
            "to install it anyway, or --dry-run to only plan",
            2,
        )


def target_of_arch(arch: str) -> str | None:
    """--arch alone names its target: gfx1100 is radeon, gfx942 mi300x, sm_90 cuda."""
    from greta_install.archs import target_for_gfx

    arch = arch.lower()
    if arch.startswith("sm_"):
        return "cuda"
    return target_for_gfx(arch)


def foreign_target(target: str, detection: Any, request: InstallRequest) -> bool:
    """The real install would refuse this target here without --force-target."""
    if request.force_target or request.snapshot or detection is None:
        return False
    return bool(detection.target != target)


def _choose_target(
    request: InstallRequest,
    explicit: Lock | None,
    detection: Any,
    why_not: str | None,
    matrix: Matrix,
) -> str:
    target_arg = request.target.lower() if request.target else None
    if not target_arg and explicit is None and request.arch:
        target_arg = target_of_arch(request.arch)
    if explicit is not None:
        if target_arg and target_arg != explicit.target:
            raise InstallFailed(
                f"{request.lock} is the lock of {explicit.target}, not {target_arg}", 2
            )
        target_arg = explicit.target
    try:
        return planning.choose_target(target_arg, detection, matrix)
    except planning.PlanError as exc:
        if detection is None and not target_arg:
            raise InstallFailed(
                f"{why_not}; pass --target (one of {', '.join(matrix.targets)})", 2
            ) from None
        raise InstallFailed(str(exc), 2) from None


def _route(
    request: InstallRequest,
    explicit: Lock | None,
    matrix: Matrix,
    target: str,
    detection: Any,
    python: str,
) -> routing.Route | None:
    """The row for the GPU's arch (None with an explicit --lock: that lock is the row)."""
    if explicit is not None:
        return None
    arch = request.arch
    if arch is None and detection is not None and detection.target == target:
        arch = detection.arch
    if arch is None:
        arch = matrix.target(target).default_arch
    try:
        return routing.route(matrix, target, arch.lower() if arch else None, request.row, python)
    except routing.RouteError as exc:
        raise InstallFailed(str(exc), 2) from None


def _lock_for(
    request: InstallRequest, explicit: Lock | None, target: str, version: str, row: str
) -> Lock:
    """The lock to install (explicit or packaged), less the pins whose marker is false."""
    try:
        if explicit is None:
            return load_lock(target, version, row).for_python(version)
        if explicit.python != version:
            raise InstallFailed(
                f"{request.lock} is for Python {explicit.python}, the interpreter is {version}", 2
            )
        return explicit.for_python(version)
    except LockError as exc:
        raise InstallFailed(str(exc), 2) from None


def _installer(request: InstallRequest, executable: str | None) -> tuple[str, str | None]:
    uv = find_uv(executable)
    installer = request.installer or ("uv" if uv else "pip")
    if installer == "uv" and uv is None:
        raise InstallFailed(
            "--installer uv: uv was not found (pip install uv, or use --installer pip)", 2
        )
    if installer == "pip" and executable is not None and not has_pip(executable):
        # Found now, not after the downloads: the offline install step runs the target's pip.
        if uv is None:
            raise InstallFailed(no_installer_message(executable), 2)
        raise InstallFailed(
            f"--installer pip: {executable} has no pip; leave --installer out (uv is there: "
            f"{uv}) or add pip with `{executable} -m ensurepip`",
            2,
        )
    return installer, uv


def no_installer_message(executable: str) -> str:
    """Neither pip nor uv: the exact commands that give this environment an installer."""
    return (
        f"{executable} has no pip and no uv was found (not on PATH, not beside the "
        f"interpreter, not as `python -m uv`): nothing could download or install. Add pip "
        f"with `{executable} -m ensurepip` (offline, from the standard library), or put uv on "
        f"PATH; then run greta install again"
    )


def prepare(request: InstallRequest) -> Prepared:
    try:
        matrix: Matrix = load_matrix()
    except MatrixError as exc:
        raise InstallFailed(str(exc), 2) from None
    executable, version = _interpreter(request)
    explicit = _explicit_lock(request.lock) if request.lock else None
    if explicit is None and version not in matrix.pythons:
        raise InstallFailed(
            f"Python {version} is not covered by GRETA's locks (Python "
            f"{', '.join(matrix.pythons)}): create the environment with one of them, e.g. "
            f"`python{matrix.pythons[-1]} -m venv .venv`",
            2,
        )
    detection, why_not = _detect(request.snapshot)
    target = _choose_target(request, explicit, detection, why_not, matrix)
    _check_machine(target, detection, request)
    detection_seen = detection
    if detection is not None and detection.target != target:
        detection = None  # planning another machine's install: this one's facts do not apply
    if detection is not None and target == "cpu" and (request.target or explicit is not None):
        # --target cpu where the GPU cannot be used: the CPU install is what was asked for,
        # so what blocks the GPU does not block it.
        detection = dataclasses.replace(detection, blockers=[])
    route = _route(request, explicit, matrix, target, detection, version)
    lock = _lock_for(request, explicit, target, version, route.row if route else "current")
    installer, uv = _installer(request, executable)
    downloader = inst.downloader_for(
        executable or "python",
        version,
        lock.meta.get("platform", matrix.platform),
        target_has_pip=executable is None or has_pip(executable),
        uv=uv,
    )
    record = _record(executable, request)
    common: dict[str, Any] = {
        "detection": detection,
        "arch": request.arch,
        "python_executable": executable,
        "installer": installer,
        "download_argv": downloader.argv(),
        "allow_unverified": request.allow_unverified,
        "strict": request.strict,
        "record": record,
        "build_kernels": request.build_kernels,
        "smoke": request.smoke,
        "allow_known_bad": request.allow_known_bad,
        "route_reason": route.reason if route and route.chosen else None,
    }
    try:
        first = planning.build_plan(matrix, lock, **common)
        source = (
            commandline.location(request.kernel_wheels, "--kernel-wheels")
            if request.kernel_wheels
            else commandline.env_location(inst.KERNEL_ENV)
        )
        lookup = inst.find_kernel_wheel(source, first.kernel_wheel.requirement, request.allow_http)
        plan = planning.build_plan(matrix, lock, kernel=lookup, **common)
    except (planning.PlanError, MatrixError, commandline.LocationError) as exc:
        raise InstallFailed(str(exc), 2) from None
    if why_not and not request.target and explicit is None:
        plan.warnings.insert(0, f"{why_not}: planning for target {target}")
    if request.dry_run and executable and foreign_target(target, detection_seen, request):
        # The plan is right for that machine, but it is a plan for this interpreter, and
        # here the real run refuses without the flag. (`--python 3.12`, a version only,
        # plans for another machine: nothing to refuse there.)
        plan.refusals.append(
            f"this machine is {detection_seen.target}, not {target}: installing it here needs "
            "--force-target (or run the install on the target machine)"
        )
    plan.keep_failed = request.keep_failed
    plan.wheelhouse = request.wheelhouse
    return Prepared(request, plan, downloader, uv, executable, steps_for(plan), record)


def _record(executable: str | None, request: InstallRequest) -> Any:
    """Every hash trusted so far for this install: the user's, the environment's, and
    the one given with --from-record (InstallFailed when they disagree)."""
    from pathlib import Path

    from greta_install.environment.tools import site_packages_of
    from greta_install.install.hashrecord import HashRecordError, known_record

    site = None
    if executable is not None:
        try:
            site = site_packages_of(executable)
        except (ValueError, OSError):
            site = None
    extra = Path(request.from_record) if request.from_record else None
    if extra is not None and extra.is_dir():  # a wheelhouse: its record sits inside
        from greta_install.install.hashrecord import RECORD_NAME

        extra = extra / RECORD_NAME
    try:
        return known_record(site, extra)
    except HashRecordError as exc:
        raise InstallFailed(str(exc), 2) from None
