from __future__ import annotations

from typing import Any

from greta_core.errors import GretaInputError
from greta_core.jax._runtime import jax_arch, use_triton
from greta_core.observe import record


def vec_add(x: Any, y: Any) -> Any:
    """x + y through the GRETA Triton kernel (GPU) or jax.numpy.

    Raises GretaInputError when the shapes or dtypes differ.
    """
    import jax.numpy as jnp

    if x.shape != y.shape or x.dtype != y.dtype:
        raise GretaInputError(
            f"vec_add: arguments 'x' {x.shape} {x.dtype} and 'y' {y.shape} {y.dtype} "
            "must have one shape and dtype"
        )
    if not use_triton():
        record("vec_add", "reference-jnp")
        return jnp.add(x, y)
    from greta_core.jax._plan import run
    from greta_core.ops.vec_add import plan

    return run(plan(x.shape, str(x.dtype), jax_arch()), (x, y))[0]
