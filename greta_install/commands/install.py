"""`greta install`: install the locked torch/triton/jax set for this machine, all or nothing."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any

HELP = "Install the locked, mutually compatible torch / triton / jax set (+ GRETA kernel wheel)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target", help="mi300x, radeon, instinct, cuda or cpu (default: detected)"
    )
    parser.add_argument("--arch", help="GPU arch, e.g. gfx942, gfx1103, sm_90 (default: detected)")
    parser.add_argument(
        "--python",
        help="interpreter of the environment to install into (default: this one); "
        "with --dry-run a version like 3.12 plans for an interpreter you do not have here",
    )
    parser.add_argument(
        "--installer", choices=("uv", "pip"), help="default: uv when available, else pip"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the plan; change nothing")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--allow-unverified",
        action="store_true",
        help="install pins whose hash the lock could not record; greta shows the hash it saw",
    )
    parser.add_argument(
        "--kernel-wheels",
        help="directory or simple-index URL holding GRETA kernel wheels (default: $GRETA_KERNEL_INDEX)",
    )
    parser.add_argument(
        "--snapshot", help="plan from a `greta snapshot` directory instead of this machine"
    )
    parser.add_argument(
        "--lock",
        help="install this GRETA lock file instead of the packaged one (its target and Python must match)",
    )


def _detect(snapshot: str | None) -> tuple[Any, str | None]:
    """Detection through greta_install.detect when this build has it; else (None, why)."""
    try:
        from greta_install import detect as detect_module  # type: ignore[attr-defined]
        from greta_install.system_view import open_view
    except ImportError:
        return None, "detection is not available in this build"
    fn = getattr(detect_module, "detect", None)
    if fn is None:
        return None, "detection is not available in this build"
    try:
        return fn(open_view(snapshot)), None
    except FileNotFoundError as exc:
        return None, str(exc)
    except Exception as exc:  # detection must never take the installer down
        return None, f"detection failed ({exc.__class__.__name__}: {exc})"


def _fail(message: str, as_json: bool, code: int = 2) -> int:
    if as_json:
        print(json.dumps({"error": message}, indent=2))
    print(f"greta install: {message}", file=sys.stderr)
    return code


def run(args: argparse.Namespace) -> int:
    from greta_install import installer as inst
    from greta_install import plan as planning
    from greta_install.lockfile import LockError, load_lock, parse_lock
    from greta_install.matrix import MatrixError, load_matrix
    from greta_install.tools import find_uv, has_pip, python_version_of, site_packages_of

    try:
        matrix = load_matrix()
    except MatrixError as exc:
        return _fail(str(exc), args.json)

    executable: str | None
    if args.python and re.fullmatch(r"3\.\d+", args.python) and not os.path.exists(args.python):
        if not args.dry_run:
            return _fail(
                "a real install needs --python PATH to an interpreter (a version only plans)",
                args.json,
            )
        executable, version = None, args.python
    else:
        executable = args.python or sys.executable
        try:
            version = python_version_of(executable)
        except ValueError as exc:
            return _fail(str(exc), args.json)

    explicit_lock = None
    if args.lock:
        try:
            with open(args.lock, encoding="utf-8") as fh:
                explicit_lock = parse_lock(fh.read(), origin=args.lock)
        except (OSError, UnicodeDecodeError) as exc:
            return _fail(f"cannot read lock file {args.lock}: {exc}", args.json)
        except LockError as exc:
            return _fail(str(exc), args.json)
        if args.target and args.target != explicit_lock.target:
            return _fail(
                f"{args.lock} is the lock of {explicit_lock.target}, not {args.target}", args.json
            )
        args.target = explicit_lock.target

    detection, why_not = _detect(args.snapshot)
    try:
        target = planning.choose_target(args.target, detection, matrix)
    except planning.PlanError as exc:
        if detection is None and not args.target:
            return _fail(
                f"{why_not}; pass --target (one of {', '.join(matrix.targets)})", args.json
            )
        return _fail(str(exc), args.json)
    if detection is not None and detection.target != target:
        detection = None  # planning another machine's install: this one's facts do not apply

    if explicit_lock is not None:
        lock = explicit_lock
        if lock.python != version:
            return _fail(
                f"{args.lock} is for Python {lock.python}, the interpreter is {version}", args.json
            )
    else:
        try:
            lock = load_lock(target, version)
        except LockError as exc:
            return _fail(str(exc), args.json)

    uv = find_uv()
    installer = args.installer or ("uv" if uv else "pip")
    if installer == "uv" and uv is None:
        return _fail(
            "--installer uv: uv was not found (pip install uv, or use --installer pip)", args.json
        )

    downloader = inst.downloader_for(
        executable or "python",
        version,
        lock.meta.get("platform", matrix.platform),
        target_has_pip=executable is None or has_pip(executable),
    )
    kernel_source = args.kernel_wheels or os.environ.get(inst.KERNEL_ENV) or None
    common: dict[str, Any] = {
        "detection": detection,
        "arch": args.arch,
        "python_executable": executable,
        "installer": installer,
        "download_argv": downloader.argv(),
        "allow_unverified": args.allow_unverified,
    }
    try:
        first = planning.build_plan(matrix, lock, **common)
        lookup = inst.find_kernel_wheel(kernel_source, first.kernel_wheel.requirement)
        plan = planning.build_plan(matrix, lock, kernel=lookup, **common)
    except (planning.PlanError, MatrixError) as exc:
        return _fail(str(exc), args.json)
    if detection is None and not args.target:
        plan.warnings.insert(0, f"{why_not}: planning for target {target}")

    if args.dry_run:
        if args.json:
            print(json.dumps(plan.to_json(), indent=2))
        else:
            print(render_plan(plan))
        return 0

    if plan.blockers:
        print(render_plan(plan), file=sys.stderr)
        for blocker in plan.blockers:
            print(f"greta install: refused: {blocker}", file=sys.stderr)
        return 1
    assert executable is not None
    try:
        site_packages = site_packages_of(executable)
    except (ValueError, OSError) as exc:
        return _fail(str(exc), args.json)

    def log(message: str) -> None:
        print(message, file=sys.stderr if args.json else sys.stdout, flush=True)

    for warning in plan.warnings:
        log(f"warning: {warning}")
    try:
        staged = inst.execute(plan, downloader, uv, site_packages, log)
    except inst.InstallError as exc:
        if exc.package == "install":
            return _fail(f"failed during the offline install step: {exc.reason}", args.json, 1)
        return _fail(
            f"failed: {exc.package}: {exc.reason}. Nothing was installed; the environment is unchanged.",
            args.json,
            1,
        )
    except KeyboardInterrupt:
        return _fail(
            "interrupted while staging: nothing was installed; the environment is unchanged.",
            args.json,
            130,
        )
    warmed = None
    if plan.kernel_wheel.status == "found":
        warmed = inst.warm_kernel_wheel(executable, log)
    result = {
        "installed": sorted(f"{n}=={_version(plan, n)}" for n in staged.files),
        "host_launchers_built": warmed,
        "unverified_observed": staged.observed_unverified,
        "env": plan.env,
        "kernel_wheel": plan.kernel_wheel.to_json(),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        log(f"installed {len(staged.files)} packages for {plan.target} into {executable}")
        if plan.kernel_wheel.status != "found" and plan.kernel_wheel.requirement:
            log(planning.JIT_NOTE)
        if plan.env:
            log(
                "environment fixes (applied at start-up of this environment's Python; see `greta env`):"
            )
            for key, value in sorted(plan.env.items()):
                log(f"  {key}={value}")
    return 0


def _version(plan: Any, name: str) -> str:
    for pkg in plan.packages:
        if pkg.name == name:
            return str(pkg.version)
    req = plan.kernel_wheel.requirement or ""
    return req.split("==", 1)[1] if req.startswith(name) else "?"


def render_plan(plan: Any) -> str:
    lines = [
        f"GRETA install plan: target {plan.target}"
        + (f", arch {plan.arch}" if plan.arch else "")
        + f", Python {plan.python_version}"
        + (f" ({plan.python_executable})" if plan.python_executable else "")
        + f", installer {plan.installer}",
        f"lock: {plan.lock_file} ({plan.platform})",
        f"packages ({len(plan.packages)}):",
    ]
    width = max(len(p.name) for p in plan.packages)
    vwidth = max(len(p.version) for p in plan.packages)
    for p in plan.packages:
        status = "verified" if p.verified else "UNVERIFIED"
        role = f"  [{p.role}]" if p.role else ""
        lines.append(
            f"  {p.name:<{width}}  {p.version:<{vwidth}}  {status:<10}  {p.index or 'default index'}{role}"
        )
    kw = plan.kernel_wheel
    if kw.requirement:
        where = f" from {kw.location}" if kw.location else ""
        lines.append(f"kernel wheel: {kw.requirement} ({kw.status}{where}; {kw.note})")
    else:
        lines.append(f"kernel wheel: none ({kw.note})")
    if plan.env:
        lines.append("environment fixes:")
        for key, value in sorted(plan.env.items()):
            lines.append(f"  {key}={value}  # {plan.env_why.get(key, '')}")
    else:
        lines.append("environment fixes: none")
    if plan.warnings:
        lines.append("warnings:")
        lines += [f"  - {w}" for w in plan.warnings]
    if plan.blockers:
        lines.append("not ready:")
        lines += [f"  - {b}" for b in plan.blockers]
    lines.append("commands:")
    lines += [f"  {c}" for c in plan.commands["shell"]]
    if plan.commands.get("env"):
        lines.append(f"  ({plan.commands['env']})")
    return "\n".join(lines)
