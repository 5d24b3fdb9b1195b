"""The ptxas XLA assembles jax-triton's kernels with (greta_install/environment/ptxas.py).

XLA takes the first ptxas it finds (PATH, then the CUDA toolkit's folder), not the newer
one the locked nvidia-cuda-nvcc wheel installed; Triton's PTX then names an ISA version the
older ptxas refuses, and every GRETA JAX op fails ("Unsupported .version 9.4; current
version is '9.0'": Triton 3.9 on a CUDA 13.0 toolkit, measured on the lent H200).
"""

from __future__ import annotations

from greta_install.doctor.facts import Facts
from greta_install.doctor.model import Finding, fail, ok, skip, warn
from greta_install.environment.ptxas import TOOLKIT_BIN, Ptxas, export_line, version_text

from ._common import SNAPSHOT_SKIP

WHY = (
    "XLA assembles jax-triton's kernels with the first ptxas it finds, and Triton's PTX "
    "names an ISA version an older ptxas refuses ('Unsupported .version')"
)


def _where(found: Ptxas, facts: Facts) -> str:
    assert facts.ptxas is not None
    return "first on PATH" if found is facts.ptxas.first else f"in {TOOLKIT_BIN} (PATH has none)"


def check_ptxas(facts: Facts) -> Finding:
    if facts.target != "cuda":
        return skip(
            f"applies to the cuda target only (target: {facts.target or 'unknown'}); "
            "no ptxas was looked at"
        )
    if not facts.live:
        return skip(SNAPSHOT_SKIP)
    if facts.ptxas is None:
        return skip("the ptxas versions were not collected")
    if facts.dists is not None and facts.dist("jax") is None:
        return skip(
            "jax is not installed: nothing hands Triton's PTX to XLA's ptxas "
            "(torch's Triton runs the ptxas it ships); no ptxas was compared"
        )
    found = facts.ptxas
    other = found.competitor
    wheel = found.wheel
    if wheel is None:
        what = (
            f"XLA finds {other.described} {_where(other, facts)}"
            if other
            else f"no ptxas on PATH or in {TOOLKIT_BIN} either"
        )
        return skip(
            "no ptxas from NVIDIA wheels in this environment (looked in "
            f"{', '.join(found.searched)}): nothing to compare; {what}",
            searched=list(found.searched),
        )
    fix = export_line(str(found.wheel_dir))
    details = {
        "wheel": wheel.path,
        "wheel_version": version_text(wheel.version),
        "first": other.path if other else None,
        "first_version": version_text(other.version) if other else None,
    }
    if other is None:
        return ok(
            f"no ptxas on PATH or in {TOOLKIT_BIN}: none comes before the wheel's "
            f"{wheel.described}",
            **details,
        )
    if found.first_is_wheel:
        return ok(f"the first ptxas on PATH is the wheel's: {wheel.described}", **details)
    unknown = [p for p in (other, wheel) if p.version is None]
    if unknown:
        said = "; ".join(f"{p.path}: {p.error}" for p in unknown)
        return warn(
            f"cannot tell whether {other.path} ({_where(other, facts)}) assembles the PTX of "
            f"this Triton: the version of {', '.join(p.path for p in unknown)} is unknown "
            f"({said}); {WHY}. The fix puts the locked wheel's ptxas first either way",
            fix,
            **details,
        )
    assert other.version is not None and wheel.version is not None
    if other.version >= wheel.version:
        return ok(
            f"XLA finds {other.described} {_where(other, facts)}, not older than the "
            f"wheel's {wheel.described}",
            **details,
        )
    finding = (
        f"XLA finds {other.described} {_where(other, facts)}, older than this environment's "
        f"{wheel.described}; {WHY}"
    )
    if facts.dist("jax-triton") is not None:
        return fail(finding + ": GRETA's JAX ops fail to compile", fix, **details)
    return warn(
        finding + " (jax-triton is not installed: XLA's own kernels may still run)", fix, **details
    )
