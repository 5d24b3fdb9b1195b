"""Failure mode 8: exactly one distribution may provide `triton`, at the version torch requires."""

from __future__ import annotations

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from greta_install import triton_range
from greta_install.doctor.facts import Facts, InstalledDist
from greta_install.doctor.model import Finding, fail, ok, skip, warn

from ._common import (
    SNAPSHOT_SKIP,
    first_line,
    install_fix,
    lock_packages,
    lock_pin,
    pip_install_line,
    section_of,
)

# Distributions known to install the `triton` import package (their files are also scanned).
TRITON_DISTS = frozenset(
    {"triton", "triton-rocm", "pytorch-triton-rocm", "pytorch-triton", "pytorch-triton-xpu"}
)


def providers(facts: Facts) -> list[InstalledDist]:
    return [d for d in facts.dists or () if d.provides_triton or d.name in TRITON_DISTS]


def _applies(req: Requirement) -> bool:
    if req.marker is None:
        return True
    try:
        return bool(req.marker.evaluate({"extra": ""}))
    except Exception:
        return True  # an unevaluable marker: assume it applies, so the check stays strict


def torch_triton_requirement(torch: InstalledDist) -> Requirement | None:
    for line in torch.requires:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) in TRITON_DISTS and _applies(req):
            return req
    return None


def check_providers(facts: Facts) -> Finding:
    if not facts.live:
        return skip(SNAPSHOT_SKIP)
    if facts.dists is None:
        return skip("installed distributions were not listed")
    found = providers(facts)
    listed = ", ".join(f"{d.name} {d.version}" for d in found)
    if len(found) > 1:
        keep = None
        torch = facts.dist("torch")
        req = torch_triton_requirement(torch) if torch else None
        if req is not None:
            keep = canonicalize_name(req.name)
        remove = " ".join(d.name for d in found)
        fix = f"pip uninstall -y {remove} && {install_fix(facts)}"
        if keep:
            fix += f"   # torch needs {req}"
        return fail(
            f"{len(found)} distributions install the same `triton` package ({listed}): "
            "whichever was installed last overwrote the others' files",
            fix,
            providers=[d.name for d in found],
        )
    if not found:
        return warn(
            "no distribution provides `triton` (GRETA's kernels need it)", install_fix(facts)
        )
    # One environment holds torch + JAX + jax-triton with ONE `triton` module: the
    # distribution the lock pins (triton-rocm on ROCm). jax-triton asks for `triton`
    # and runs on that one; the default index's `triton` beside or instead of it is wrong.
    pinned = [p.name for p in lock_packages(facts) if p.name in TRITON_DISTS]
    if pinned and found[0].name not in pinned:
        return fail(
            f"`triton` comes from {listed}, but the {facts.target} lock pins {pinned[0]} (the "
            "build torch was made with); something (often jax-triton's dependency on `triton`) "
            "replaced it",
            f"pip uninstall -y {found[0].name} && {install_fix(facts)}",
            providers=[found[0].name],
            pinned=pinned[0],
        )
    return ok(f"one triton provider: {listed}", providers=[found[0].name])


def _index_for(facts: Facts, name: str) -> str | None:
    for candidate in (name, "torch"):
        pin = lock_pin(facts, candidate)
        if pin is not None and pin.index:
            return str(pin.index)
    return None


def _pin_from(req: Requirement) -> str | None:
    specs = list(req.specifier)
    if len(specs) == 1 and specs[0].operator in ("==", "==="):
        return specs[0].version
    return None


def check_version(facts: Facts) -> Finding:
    if not facts.live:
        return skip(SNAPSHOT_SKIP)
    if facts.dists is None:
        return skip("installed distributions were not listed")
    probe_triton = section_of(facts.torch_probe, "triton")
    if probe_triton.get("error"):
        return fail(
            f"import triton fails: {first_line(probe_triton['error'])}",
            f"pip uninstall -y {' '.join(d.name for d in providers(facts)) or 'triton'} && {install_fix(facts)}",
            error=probe_triton["error"],
        )
    torch = facts.dist("torch")
    if torch is None:
        return skip("torch is not installed: no triton requirement to compare with")
    req = torch_triton_requirement(torch)
    if req is None:
        found = providers(facts)
        have = ", ".join(f"{d.name} {d.version}" for d in found) or "none installed"
        return ok(f"torch {torch.version} declares no triton dependency ({have})")
    name = canonicalize_name(req.name)
    dist = facts.dist(name)
    version = _pin_from(req)
    index = _index_for(facts, name)
    if dist is None:
        others = [d for d in providers(facts)]
        instead = (
            f"; installed instead: {', '.join(f'{d.name} {d.version}' for d in others)}"
            if others
            else ""
        )
        fix = pip_install_line([(name, version)], [index]) if version else f"pip install '{req}'"
        return fail(f"torch {torch.version} requires {req} but it is not installed{instead}", fix)
    if not req.specifier.contains(dist.version, prereleases=True):
        fix = (
            pip_install_line([(name, version)], [index], force=True)
            if version
            else f"pip install --force-reinstall '{req}'"
        )
        return fail(f"torch {torch.version} requires {req}; installed {name} {dist.version}", fix)
    return ok(f"{name} {dist.version} satisfies torch's {req}", requirement=str(req))


def check_fast_launch(facts: Facts) -> Finding:
    """GRETA's eager fast launch path serves the Triton versions of greta_install.triton_range;
    any other Triton still runs every kernel, through Triton's own (slower) launch path."""
    if not facts.live:
        return skip(SNAPSHOT_SKIP)
    if facts.target == "cpu":
        return skip("CPU target: kernels run in Triton's interpreter, no launch path to speed up")
    version = section_of(facts.torch_probe, "triton").get("version")
    if not version:
        return skip("triton is not importable (see triton.version)")
    reason = triton_range.fast_launch_off_reason(str(version))
    if reason is not None:
        return warn(
            f"{reason}: GRETA's kernels launch through Triton's own path (tens of "
            "microseconds more host time per call), and kernel wheels built for it are unused",
            install_fix(facts),
            triton=version,
        )
    return ok(
        f"fast launch on: Triton {version} (GRETA supports {triton_range.supported_text()})",
        triton=version,
    )
