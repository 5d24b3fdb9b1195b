"""Is there anything to do? An environment that already matches the plan is left alone.

Re-running `greta install` on an environment installed from the same lock used to
download everything again; this compares what is installed (read in the target
environment itself) with the plan: every package at its locked version, the kernel
wheel when the plan has one, and the persisted environment fixes.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from packaging.utils import canonicalize_name

from greta_install import commandline
from greta_install.plan.install_plan import InstallPlan

_LIST = (
    "import importlib.metadata as m, json; "
    "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions() "
    "if d.metadata['Name']}))"
)


def installed_versions(python: str, timeout: float = 60) -> dict[str, str] | None:
    """canonical name -> version of every distribution in `python`'s environment."""
    try:
        proc = subprocess.run(
            [python, commandline.ISOLATED, "-c", _LIST],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            cwd=commandline.NEUTRAL_CWD,
        )
        data = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None
    if not isinstance(data, dict):
        return None
    return {str(canonicalize_name(k)): str(v) for k, v in data.items()}


def differences(
    plan: InstallPlan, installed: dict[str, str], env_fixes: dict[str, str] | None
) -> list[str]:
    """What differs between the plan and the environment (empty: nothing to do). Pure."""
    out = []
    for pkg in plan.packages:
        have = installed.get(pkg.name)
        if have != pkg.version:
            out.append(f"{pkg.name}: {have or 'missing'} (lock: {pkg.version})")
    kw = plan.kernel_wheel
    if kw.requirement and kw.status in ("found", "build"):
        name, _, version = kw.requirement.partition("==")
        if installed.get(str(canonicalize_name(name))) != version:
            out.append(f"{name}: {installed.get(str(canonicalize_name(name))) or 'missing'}")
    if (env_fixes or {}) != plan.env:
        out.append("environment fixes differ")
    return out


def already_installed(plan: InstallPlan, python: str) -> str | None:
    """A sentence saying the environment already matches, or None when it does not."""
    from greta_install.environment import envfix
    from greta_install.environment.tools import site_packages_of

    installed = installed_versions(python)
    if installed is None:
        return None
    try:
        site = Path(site_packages_of(python))
        data = envfix.read_env_fixes(site)
    except (ValueError, OSError, envfix.EnvFixError):
        return None
    fixes = dict(data.get("env", {})) if isinstance(data, dict) else None
    if differences(plan, installed, fixes):
        return None
    return (
        f"the {len(plan.packages)} packages of {plan.lock_file} are installed at the locked "
        "versions and the environment fixes match"
    )
