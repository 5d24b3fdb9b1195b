"""The environment against the lock for this target: pins installed, pins on the index
(failure mode 7), and the GRETA kernel wheel for the arch."""

from __future__ import annotations

from typing import Any

from packaging.markers import InvalidMarker, Marker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name

from greta_install import kernel_names
from greta_install.doctor.checks.python import SELF_INSTALL
from greta_install.doctor.facts import Facts
from greta_install.doctor.model import Finding, fail, ok, skip, warn

from ._common import SNAPSHOT_SKIP, lock_packages, pip_install_line, primary_gpu

LIST_LIMIT = 6
PIP_LINE_LIMIT = 4  # beyond this the pip line is unreadable; greta install is the fix


def _applies(pkg: Any) -> bool:
    marker = pkg.marker
    if not marker:
        return True
    try:
        return bool(Marker(str(marker)).evaluate({"extra": ""}))
    except (InvalidMarker, Exception):
        return True


def _matches(installed: str, locked: str) -> bool:
    # PEP 440 "==": a pin without a local label (2.10.0) accepts 2.10.0+rocm7.1.
    try:
        return SpecifierSet(f"=={locked}").contains(installed, prereleases=True)
    except InvalidSpecifier:
        return installed == locked


def _short(items: list[str]) -> str:
    more = len(items) - LIST_LIMIT
    return ", ".join(items[:LIST_LIMIT]) + (f" and {more} more" if more > 0 else "")


def _lock_problem(facts: Facts) -> Finding | None:
    if not facts.live:
        return skip(SNAPSHOT_SKIP)
    if not facts.target:
        return skip("no target, so no lock")
    if facts.lock is None:
        py = facts.python
        if py is not None and facts.lock_pythons and py.minor not in facts.lock_pythons:
            # python.version says why and gives the fix; `greta lock` is a maintainer's
            # command and would not help a user on an unsupported Python.
            newest = facts.lock_pythons[-1]
            return fail(
                f"no lock for target {facts.target} on Python {py.minor} "
                f"(the locks cover {', '.join(facts.lock_pythons)})",
                f"python{newest} -m venv .venv && {SELF_INSTALL} "
                f"&& .venv/bin/greta install --target {facts.target}",
                error=facts.lock_error,
            )
        return fail(
            f"no lock for target {facts.target}: {facts.lock_error or 'unknown reason'}",
            "update this GRETA checkout (`git pull`): its lock/ directory has no lock for "
            f"{facts.target}; `greta install --target cpu` works everywhere",
            error=facts.lock_error,
        )
    return None


def check_installed(facts: Facts) -> Finding:
    if problem := _lock_problem(facts):
        return problem
    if facts.dists is None:
        return skip("installed distributions were not listed")
    pkgs = [p for p in lock_packages(facts) if _applies(p)]
    missing: list[Any] = []
    wrong: list[tuple[Any, str]] = []
    for pkg in pkgs:
        dist = facts.dist(canonicalize_name(str(pkg.name)))
        if dist is None:
            missing.append(pkg)
        elif not _matches(dist.version, str(pkg.version)):
            wrong.append((pkg, dist.version))
    unverified = [str(p.name) for p in pkgs if not p.verified]
    details = {
        "missing": [f"{p.name}=={p.version}" for p in missing],
        "mismatched": {str(p.name): {"locked": str(p.version), "installed": v} for p, v in wrong},
        "unverified": unverified,
        "pins": len(pkgs),
    }
    note = (
        f"; {len(unverified)} pin(s) unverified (no hash where the lock was made): {_short(unverified)}"
        if unverified
        else ""
    )
    if missing or wrong:
        parts = []
        if wrong:
            parts.append(
                "differ from the lock: "
                + _short([f"{p.name} {v} (lock {p.version})" for p, v in wrong])
            )
        if missing:
            parts.append("missing: " + _short([f"{p.name}=={p.version}" for p in missing]))
        off = [p for p, _ in wrong] + missing
        fix = f"greta install --target {facts.target}"
        if len(off) <= PIP_LINE_LIMIT:
            line = pip_install_line(
                [(str(p.name), str(p.version)) for p in off],
                [p.index for p in off],
            )
            fix += "\nor: " + line.replace("pip install", "pip install --no-deps", 1)
        return warn(
            f"{len(off)} of {len(pkgs)} locked package(s) {'; '.join(parts)}{note}", fix, **details
        )
    if unverified:
        return warn(
            f"all {len(pkgs)} locked packages installed{note}",
            f"greta install --target {facts.target} --allow-unverified   # shows the hash it saw for each unverified pin",
            **details,
        )
    return ok(
        f"all {len(pkgs)} locked packages for {facts.target} are installed at the locked versions",
        **details,
    )


def check_index(facts: Facts) -> Finding:
    if not facts.live:
        return skip(SNAPSHOT_SKIP)
    if not facts.check_index:
        return skip("the index was not queried (it needs the network): greta doctor --check-index")
    if problem := _lock_problem(facts):
        return skip(f"no lock to check ({problem.finding})")
    if facts.index_status is None:
        return skip("the index query did not run")
    status = facts.index_status
    missing = [k for k, v in status.items() if v == "missing"]
    unknown = {k: v for k, v in status.items() if v.startswith("unknown")}
    if missing:
        return fail(
            f"{len(missing)} locked version(s) are not on their index: {_short(missing)}",
            f"greta lock --target {facts.target} --check --resolve   # maintainers: re-resolve the lock, then release it",
            missing=missing,
            unknown=unknown,
        )
    if unknown and len(unknown) == len(status):
        return skip(f"the index could not be reached: {next(iter(unknown.values()))}")
    found = len(status) - len(unknown)
    if unknown:
        return warn(
            f"{found} pin(s) found on their index; {len(unknown)} could not be checked: {_short(list(unknown))}",
            "greta doctor --check-index   # again, from a machine that reaches every index",
            unknown=unknown,
        )
    return ok(f"all {found} locked versions are on their index")


def _kernel_dist(facts: Facts, arch: str) -> tuple[str, str | None]:
    spec = facts.lock.kernel_wheel if facts.lock is not None else None
    if spec:
        try:
            req = Requirement(str(spec))
            pins = [s.version for s in req.specifier if s.operator == "=="]
            return canonicalize_name(req.name), pins[0] if pins else None
        except InvalidRequirement:
            pass
    return canonicalize_name(kernel_names.distribution_name(arch)), None


def check_kernels(facts: Facts) -> Finding:
    if not facts.live:
        return skip(SNAPSHOT_SKIP)
    if facts.target == "cpu":
        return skip("CPU target: kernels run through the Triton interpreter or the reference code")
    gpu = primary_gpu(facts)
    arch = gpu.arch if gpu is not None else None
    if not arch:
        return skip("the GPU's arch is unknown")
    if facts.dists is None:
        return skip("installed distributions were not listed")
    name, version = _kernel_dist(facts, str(arch))
    dist = facts.dist(name)
    if dist is None:
        return warn(
            f"no GRETA kernel wheel for {arch} ({name}): kernels compile at first use instead",
            f"greta install --target {facts.target}"
            + (f"\nor: {pip_install_line([(name, version)])}" if version else ""),
            wheel=name,
        )
    if version and not _matches(dist.version, version):
        return warn(
            f"{name} {dist.version} is installed; the lock wants {version}",
            pip_install_line([(name, version)], force=True),
            wheel=name,
        )
    problems = _wheel_problems(facts, str(arch))
    if problems:
        worst = fail if any(p.status == "fail" for p in problems) else warn
        return worst(
            "; ".join(p.finding for p in problems),
            "\n".join(dict.fromkeys(p.fix for p in problems)),
            wheel=name,
        )
    return ok(_wheel_line(facts, str(arch)) or f"{name} {dist.version} is installed", wheel=name)


def _wheel_line(facts: Facts, arch: str) -> str | None:
    """The installed wheel named with its arch, Triton fingerprint and whether its code is in
    use (greta_core.kernel_wheels.installed.describe), or None when it cannot be read."""
    probe = facts.torch_probe
    data = probe.data if probe is not None else {}
    triton_version = (data.get("triton") or {}).get("version")
    try:
        from greta_core.kernel_wheels.installed import describe, installed_kernel_wheels

        match = next((w for w in installed_kernel_wheels() if w.arch == arch), None)
        return describe(match, triton_version) if match is not None else None
    except Exception:  # the doctor never crashes on a broken wheel
        return None


def _wheel_problems(facts: Facts, arch: str) -> list[Any]:
    """Arch or Triton mismatches between the installed kernel wheel and this machine."""
    probe = facts.torch_probe
    data = probe.data if probe is not None else {}
    triton_version = (data.get("triton") or {}).get("version")
    try:
        from greta_core.kernel_wheels.installed import check_kernel_wheel

        return [
            p for p in check_kernel_wheel(arch, triton_version) if p.id != "kernel-wheel-missing"
        ]
    except Exception:  # the doctor never crashes on a broken wheel
        return []


def check_env(facts: Facts) -> Finding:
    """The lock's environment variables (e.g. TRITON_INTERPRET=1 on cpu) as the child sees them."""
    if not facts.live:
        return skip(SNAPSHOT_SKIP)
    if facts.lock is None:
        return skip("no lock (see lock.installed)")
    wanted = dict(facts.lock.env) if facts.lock is not None else {}
    if not wanted:
        return ok(f"the {facts.target} lock sets no environment variables")
    seen = section_env(facts)
    off = {k: v for k, v in wanted.items() if seen.get(k) != v}
    if not off:
        return ok(
            "the lock's variables are in effect: "
            + ", ".join(f"{k}={v}" for k, v in wanted.items())
        )
    shown = ", ".join(f"{k}={v} (now {seen.get(k, 'unset')})" for k, v in off.items())
    exports = " ".join(f"{k}={v}" for k, v in off.items())
    return warn(
        f"the {facts.target} lock expects {shown}",
        f"export {exports}"
        + (
            # the saved fixes are the last install's: the right ones only when that
            # install was for the target checked here
            f'\nor: eval "$(greta env)"   # the fixes greta install saved for {facts.target}'
            if facts.target_source != "option"
            else ""
        ),
        expected=wanted,
        seen={k: seen.get(k) for k in wanted},
    )


def section_env(facts: Facts) -> dict[str, str]:
    probe = facts.torch_probe
    if probe is not None and probe.outcome == "ok" and isinstance(probe.data.get("env"), dict):
        return {str(k): str(v) for k, v in probe.data["env"].items()}
    return dict(facts.env)
