from __future__ import annotations

from typing import Any

from greta_core.jax._runtime import jax_arch, use_triton
from greta_core.observe import record


def vec_add(x: Any, y: Any) -> Any:
    """x + y through the GRETA Triton kernel (GPU) or jax.numpy."""
    import jax
    import jax.numpy as jnp

    if x.shape != y.shape or x.dtype != y.dtype:
        raise ValueError(
            f"vec_add: arguments 'x' {x.shape} {x.dtype} and 'y' {y.shape} {y.dtype} "
            "must have one shape and dtype"
        )
    if not use_triton():
        record("vec_add", "reference-jnp")
        return jnp.add(x, y)

    import jax_triton as jt

    from greta_core import configs
    from greta_core.kernels.vec_add import grid, vec_add_kernel

    arch = jax_arch()
    n = x.size
    config = configs.lookup("vec_add", arch, {"n": n})
    block = config["BLOCK"]
    record("vec_add", "jax-triton", arch)
    out = jt.triton_call(
        x.reshape(-1),
        y.reshape(-1),
        n,
        kernel=vec_add_kernel,
        out_shape=jax.ShapeDtypeStruct((n,), x.dtype),
        grid=grid(n, block),
        num_warps=config.get("num_warps", 4),
        num_stages=config.get("num_stages", 3),
        BLOCK=block,
    )
    return out.reshape(x.shape)
