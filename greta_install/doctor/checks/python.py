"""The interpreter: a version the lock covers, and a virtual environment rather than the system's."""

from __future__ import annotations

from greta_install.doctor.facts import Facts
from greta_install.doctor.model import Finding, fail, ok, skip, warn

from ._common import needs_live

# The oldest Python any lock row covers and requires-python in pyproject.toml allows.
MIN_PYTHON = (3, 11)


# GRETA installs from its repository: the public `greta` name belongs to another project.
SELF_INSTALL = ".venv/bin/python -m pip install PATH_TO_GRETA_CHECKOUT"


def check_version(facts: Facts) -> Finding:
    if (skipped := needs_live(facts)) or facts.python is None:
        return skipped or skip("Python facts were not collected")
    py = facts.python
    try:
        parts = tuple(int(p) for p in py.version.split(".")[:2])
    except ValueError:
        parts = (0, 0)
    if parts < MIN_PYTHON:
        return fail(
            f"Python {py.version} is older than GRETA supports (3.11+)",
            f"python3.11 -m venv .venv && {SELF_INSTALL}",
            python=py.version,
        )
    if facts.lock is not None:
        return ok(
            f"Python {py.version}; the {facts.target} lock covers Python {py.minor}",
            python=py.version,
        )
    if not facts.target:
        return skip(f"Python {py.version}; no target, so no lock to compare with")
    if facts.lock_pythons:
        choices = ", ".join(facts.lock_pythons)
        newest = facts.lock_pythons[-1]
        # Nothing GRETA locks installs on this interpreter: a failure, not a warning.
        return fail(
            f"Python {py.version}: the {facts.target} lock has no Python {py.minor} row "
            f"(it covers {choices}); {facts.lock_error or ''}".rstrip("; "),
            f"python{newest} -m venv .venv && {SELF_INSTALL} "
            f"&& .venv/bin/greta install --target {facts.target}",
            python=py.version,
            lock_pythons=list(facts.lock_pythons),
        )
    return ok(
        f"Python {py.version} (GRETA supports 3.11+); no lock to compare with (see lock.installed)",
        python=py.version,
        lock_error=facts.lock_error,
    )


def check_venv(facts: Facts) -> Finding:
    if (skipped := needs_live(facts)) or facts.python is None:
        return skipped or skip("Python facts were not collected")
    py = facts.python
    if py.conda_prefix and py.prefix == py.conda_prefix:
        return ok(f"conda environment at {py.prefix}", prefix=py.prefix)
    if py.in_venv:
        return ok(f"virtual environment at {py.prefix}", prefix=py.prefix)
    why = (
        " (marked externally managed: pip refuses to install there)"
        if py.externally_managed
        else ""
    )
    return warn(
        f"running on the system Python {py.executable}{why}; GPU wheels installed there "
        "clash with the distribution's packages",
        f"python{py.minor} -m venv .venv && {SELF_INSTALL}",
        prefix=py.prefix,
        externally_managed=py.externally_managed,
    )


def check_bytecode(facts: Facts) -> Finding:
    if (skipped := needs_live(facts)) or facts.python is None:
        return skipped or skip("Python facts were not collected")
    if not facts.bytecode:
        return skip("no framework installed (torch, triton, jax) to look at")
    missing = [s for s in facts.bytecode.values() if s.missing]
    shares = {s.package: f"{s.compiled}/{s.modules}" for s in facts.bytecode.values()}
    if not missing:
        return ok(
            "bytecode present for " + ", ".join(f"{p} ({n})" for p, n in shares.items()),
            compiled=shares,
        )
    dont_write = facts.env.get("PYTHONDONTWRITEBYTECODE")
    why = (
        " and PYTHONDONTWRITEBYTECODE is set, so imports never write it"
        if dont_write
        else ": every first import of a module compiles it again"
    )
    names = ", ".join(f"{s.package} ({s.compiled}/{s.modules} modules)" for s in missing)
    return warn(
        f"no bytecode for {names}{why}; `import torch` takes seconds longer",
        f"{facts.python.executable} -m compileall -qq -j 0 {facts.python.site_packages}",
        compiled=shares,
    )
