"""Names of a GRETA kernel wheel, from the arch it serves: the one place they are made.

``sm_90`` -> distribution ``greta-kernels-sm-90``, import package ``greta_kernels_sm_90``,
file ``greta_kernels_sm_90-<version>-py3-none-any.whl``. A leaf: the
installer, the doctor and ``greta_core`` all import it. Standard library only: the kernel
half reads it in environments that may lack ``packaging``.
"""

from __future__ import annotations

import functools
import re

WHEEL_TAG = "py3-none-any"


def distribution_name(arch: str) -> str:
    """'gfx942' -> 'greta-kernels-gfx942'; 'sm_90' -> 'greta-kernels-sm-90' (PEP 503 form)."""
    return re.sub(r"[-_.]+", "-", f"greta-kernels-{arch}").lower()


def package_name(arch: str) -> str:
    """Import package: 'sm_90' -> 'greta_kernels_sm_90'."""
    return re.sub(r"[-_.]+", "_", f"greta_kernels_{arch}").lower()


def wheel_filename(arch: str, version: str) -> str:
    return f"{package_name(arch)}-{version}-{WHEEL_TAG}.whl"


def requirement(arch: str, version: str) -> str:
    """'greta-kernels-gfx942==0.1.0'."""
    return f"{distribution_name(arch)}=={version}"


@functools.cache
def wheel_archs() -> tuple[str, ...]:
    """Every arch a kernel wheel is built for: each target's ``archs`` in the version
    matrix, in matrix order. The one list the runtime, the doctor and the tests read for
    "every arch" (swap the read here if the arch table moves). Stdlib only, like the rest."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    data = tomllib.loads(_matrix_text())
    targets = data.get("targets", {})
    return tuple(dict.fromkeys(a for spec in targets.values() for a in spec.get("archs", ())))


def _matrix_text() -> str:
    from importlib import resources
    from pathlib import Path

    try:  # the installed package's copy (see greta_install.locks.lockfile.lock_resource_dir)
        return resources.files("greta_install.lockdata").joinpath("matrix.toml").read_text()
    except ModuleNotFoundError:  # a source checkout: lock/ beside the package
        return (Path(__file__).resolve().parent.parent / "lock" / "matrix.toml").read_text()
