"""`greta install`: install the locked torch/triton/jax set for this machine, all or nothing."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from greta_install.commandline import interpreter_path
from greta_install.locks.matrix import ROW_NAMES

if TYPE_CHECKING:
    from greta_install.install import pipeline

HELP = "Install the locked, mutually compatible torch / triton / jax set (+ GRETA kernel wheel)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target", help="mi300x, radeon, instinct, cuda or cpu (default: detected)"
    )
    parser.add_argument("--arch", help="GPU arch, e.g. gfx942, gfx1103, sm_90 (default: detected)")
    parser.add_argument(
        "--python",
        type=interpreter_path,
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
        "--allow-http",
        action="store_true",
        help="accept plain http:// kernel-wheel indexes (default: https only)",
    )
    parser.add_argument(
        "--force-target",
        action="store_true",
        help="install a lock or --target made for another kind of machine than this one",
    )
    parser.add_argument(
        "--lock",
        help="install this GRETA lock file instead of the packaged one (its target and Python must match)",
    )
    parser.add_argument(
        "--row",
        choices=ROW_NAMES,
        default=None,
        help="which row of the target (default: the first whose torch build carries the "
        "GPU's arch): current, therock (AMD's per-target build) or previous (older drivers / "
        "ROCm user space); see docs/en/framework_versions.md",
    )
    parser.add_argument(
        "--allow-known-bad-arch",
        action="store_true",
        help="install on an arch known to compute wrong results with every public build "
        "(e.g. gfx1033); refused by default",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="refuse every file without a hash in the lock or in --from-record "
        "(no trust on first use)",
    )
    parser.add_argument(
        "--from-record",
        metavar="FILE_OR_DIR",
        help="another install's hash record (greta-hashes.json), or a wheelhouse folder made "
        "with --save-wheelhouse: install exactly those files (offline for a wheelhouse)",
    )
    parser.add_argument(
        "--save-wheelhouse",
        metavar="DIR",
        help="after a successful install, copy every installed file and their hashes into DIR",
    )
    parser.add_argument(
        "--export-lock",
        metavar="FILE",
        help="write this machine's lock as a PEP 751 pylock.toml (e.g. pylock.cpu-py311.toml) "
        "for `uv pip install -r FILE`, and install nothing",
    )
    parser.add_argument(
        "--no-build-kernels",
        action="store_true",
        help="do not build the kernel wheel here when no source serves it (kernels JIT instead)",
    )
    parser.add_argument(
        "--no-smoke", action="store_true", help="skip the smoke test (not recommended)"
    )
    parser.add_argument(
        "--keep-failed",
        action="store_true",
        help="keep the environment when the smoke test fails (for debugging; exit status 1)",
    )
    parser.add_argument(
        "--only",
        metavar="STEPS",
        help="run only these post-install steps against the environment as it is, e.g. "
        "--only kernels,smoke (after installing torch by other means)",
    )
    parser.add_argument(
        "--reinstall",
        action="store_true",
        help="install even when the environment already matches the lock",
    )


def _fail(message: str, as_json: bool, code: int = 2) -> int:
    if as_json:
        print(json.dumps({"error": message}, indent=2))
    print(f"greta install: {message}", file=sys.stderr)
    return code


def request_of(args: argparse.Namespace) -> pipeline.InstallRequest:
    from greta_install.install import pipeline

    return pipeline.InstallRequest(
        target=args.target,
        arch=args.arch,
        python=args.python,
        installer=args.installer,
        dry_run=args.dry_run,
        allow_unverified=args.allow_unverified,
        allow_http=args.allow_http,
        force_target=args.force_target,
        kernel_wheels=args.kernel_wheels,
        snapshot=args.snapshot,
        lock=args.lock,
        row=args.row,
        allow_known_bad=args.allow_known_bad_arch,
        strict=args.strict,
        from_record=args.from_record,
        build_kernels=not args.no_build_kernels,
        smoke=not args.no_smoke,
        keep_failed=args.keep_failed,
        wheelhouse=args.save_wheelhouse,
    )


def run(args: argparse.Namespace) -> int:
    from greta_install.install import pipeline
    from greta_install.install import prepare as planning

    if args.only:
        from greta_install.install import only as install_only

        return install_only.run(args)
    log = _logger(args.json)
    try:
        prepared = planning.prepare(request_of(args))
        if args.export_lock:
            return _export_lock(prepared, args.export_lock, args.json)
        if args.dry_run:
            return _show_plan(prepared, args.json)
        if prepared.plan.blockers:
            return _refuse(prepared)
        if not args.reinstall:
            same = _already_installed(prepared)
            if same is not None and args.save_wheelhouse:
                # The wheelhouse is made from the files an install stages: say so, never
                # reinstall a matching environment unasked.
                return _fail(
                    f"{same}; --save-wheelhouse copies the files an install downloads, so it "
                    "would download and reinstall everything: add --reinstall to do that",
                    args.json,
                )
            if same is not None:
                return _nothing_to_do(same, args.json, log)
        for warning in prepared.plan.warnings:
            log(f"warning: {warning}")
        outcome = pipeline.execute(prepared, log, env=_wheelhouse_env(args.from_record))
    except pipeline.InstallFailed as exc:
        return _fail(exc.message, args.json, exc.exit_code)
    return _report(prepared, outcome, args.json, log)


def _export_lock(prepared: pipeline.Prepared, path: str, as_json: bool) -> int:
    """The lock for this machine as pylock.toml, its files found on this machine's indexes."""
    from pathlib import Path

    from greta_install.environment.tools import find_uv, pip_config_find_links
    from greta_install.locks import pylock
    from greta_install.locks.lockfile import load_lock

    out = Path(path)
    plan = prepared.plan
    if not pylock.valid_name(out):
        return _fail(
            f"--export-lock {path}: PEP 751 names it pylock.toml or pylock.<name>.toml, "
            f"e.g. {pylock.export_name(plan.target, plan.python_version, prepared.request.row)}",
            as_json,
        )
    uv = prepared.uv or find_uv(prepared.executable)
    if uv is None:
        return _fail("--export-lock needs uv to read the indexes (pip install uv)", as_json)
    try:
        lock = load_lock(plan.target, plan.python_version, prepared.request.row).for_python(
            plan.python_version
        )
        indexes, _down = pylock.vendor_indexes(lock)
        resolved = pylock.resolve(lock, uv, indexes, pip_config_find_links(prepared.executable))
        text = pylock.render(lock, resolved, prepared.request.row)
    except (pylock.PylockError, OSError) as exc:
        return _fail(f"--export-lock: {exc}", as_json, 1)
    out.write_text(text, encoding="utf-8")
    count = text.count("[[packages]]")
    if as_json:
        print(json.dumps({"pylock": str(out), "packages": count}, indent=2))
    else:
        print(f"{out}: {count} packages for {plan.target}/py{plan.python_version}")
        print(f"install with: uv pip install -r {out}")
    return 0


def _logger(as_json: bool) -> Callable[[str], None]:
    def log(message: str) -> None:
        print(message, file=sys.stderr if as_json else sys.stdout, flush=True)

    return log


def _show_plan(prepared: pipeline.Prepared, as_json: bool) -> int:
    from greta_install.install import pipeline

    if as_json:
        print(
            json.dumps({**prepared.plan.to_json(), "steps": pipeline.describe(prepared)}, indent=2)
        )
    else:
        print(render_plan(prepared))
    # Not ready is not success: scripts that plan before installing must see it.
    return 1 if prepared.plan.blockers else 0


def _refuse(prepared: pipeline.Prepared) -> int:
    print(render_plan(prepared), file=sys.stderr)
    for blocker in prepared.plan.blockers:
        print(f"greta install: refused: {blocker}", file=sys.stderr)
    return 1


def _already_installed(prepared: pipeline.Prepared) -> str | None:
    from greta_install.plan import noop

    return noop.already_installed(prepared.plan, prepared.executable or sys.executable)


def _nothing_to_do(same: str, as_json: bool, log: Callable[[str], None]) -> int:
    if as_json:
        print(json.dumps({"installed": [], "nothing_to_do": same}, indent=2))
    else:
        log(f"nothing to do: {same} (--reinstall to install anyway)")
    return 0


def _report(
    prepared: pipeline.Prepared,
    outcome: pipeline.Outcome,
    as_json: bool,
    log: Callable[[str], None],
) -> int:
    from greta_install.plan.install_plan import JIT_NOTE

    plan, staged = prepared.plan, outcome.staged
    smoke = outcome.results.get("smoke-test")
    smoke_failed = isinstance(smoke, dict) and not smoke.get("ok", True)
    if as_json:
        result = {
            "installed": sorted(f"{n}=={_version(plan, n)}" for n in staged.files),
            "steps": outcome.results,
            "host_launchers_built": outcome.results.get("warm"),
            "unverified_observed": staged.observed_unverified,
            "env": plan.env,
            "kernel_wheel": plan.kernel_wheel.to_json(),
            "recovered": outcome.recovered,
            "warnings": outcome.warnings,
            "commands_run": [*staged.commands],
        }
        print(json.dumps(result, indent=2))
        return 1 if smoke_failed else 0
    log(f"installed {len(staged.files)} packages for {plan.target} into {prepared.executable}")
    built = outcome.results.get("kernel-build")
    if plan.kernel_wheel.status == "none":
        log(f"kernel wheel: none ({plan.kernel_wheel.note})")
    elif plan.kernel_wheel.status == "build" and built:
        how = "reused from the cache" if built.get("cached") else f"built in {built['seconds']}s"
        log(f"kernel wheel: {built['wheel']} ({how})")
    elif plan.kernel_wheel.status != "found" and plan.kernel_wheel.requirement:
        log(JIT_NOTE)
    if isinstance(smoke, dict):
        status = "passed" if smoke.get("ok") else "FAILED (environment kept: --keep-failed)"
        log(f"smoke test {status} in {smoke.get('seconds')}s")
    if plan.env:
        log(
            "environment fixes (applied at start-up of this environment's Python; see `greta env`):"
        )
        for key, value in sorted(plan.env.items()):
            log(f"  {key}={value}")
    return 1 if smoke_failed else 0


def _wheelhouse_env(source: str | None) -> dict[str, str] | None:
    """A wheelhouse folder (--from-record DIR) is the only source: offline, no index."""
    import os
    from pathlib import Path

    if not source or not Path(source).is_dir():
        return None
    env = dict(os.environ)
    env["PIP_NO_INDEX"] = "1"
    env["PIP_FIND_LINKS"] = str(Path(source).resolve())
    return env


def _version(plan: Any, name: str) -> str:
    for pkg in plan.packages:
        if pkg.name == name:
            return str(pkg.version)
    req = plan.kernel_wheel.requirement or ""
    return req.split("==", 1)[1] if req.startswith(name) else "?"


def render_plan(prepared: pipeline.Prepared) -> str:
    from greta_install.install import pipeline

    plan = prepared.plan
    lines = [
        f"GRETA install plan: target {plan.target}"
        + (f", arch {plan.arch}" if plan.arch else "")
        + f", Python {plan.python_version}"
        + (f" ({plan.python_executable})" if plan.python_executable else "")
        + f", installer {plan.installer}",
        f"lock: {plan.lock_file} ({plan.platform})",
    ]
    if plan.torch_source is not None:
        src = plan.torch_source
        lines.append(f"torch source: {src.label} (row {src.row}): {src.why}")
        if src.evidence:
            lines.append(f"  evidence: {', '.join(src.evidence)}")
    if plan.route_reason:
        lines.append(f"row {plan.row} chosen: {plan.route_reason}")
    lines.append(f"packages ({len(plan.packages)}):")
    width = max(len(p.name) for p in plan.packages)
    vwidth = max(len(p.version) for p in plan.packages)
    for p in plan.packages:
        status = {"verified": "verified", "recorded": "recorded"}.get(p.hash_status, "FIRST-USE")
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
    lines.append("steps (a failure after `commit` puts the environment back as it was):")
    for step in pipeline.describe(prepared):
        optional = "" if step.get("required", True) else " (optional)"
        lines.append(f"  {step['step']}{optional}")
        lines += [f"    {c}" for c in step["commands"]]
    return "\n".join(lines)
