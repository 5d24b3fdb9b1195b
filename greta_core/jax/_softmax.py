from __future__ import annotations

import functools
from typing import Any

from greta_core.jax._rows_common import call_options, check_rows, compute_dtype, triton_ok
from greta_core.observe import record


def _fwd_impl(x: Any) -> Any:
    import jax

    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    rows = x2.shape[0]
    if triton_ok(x) and rows > 0:
        import jax_triton as jt

        from greta_core.jax._runtime import jax_arch
        from greta_core.kernels._rows import row_plan
        from greta_core.kernels.softmax import softmax_fwd_kernel

        plan = row_plan("softmax", jax_arch(), n)
        record("softmax", "jax-triton", jax_arch())
        y = jt.triton_call(
            x2, n, n, kernel=softmax_fwd_kernel,
            out_shape=jax.ShapeDtypeStruct(x2.shape, x.dtype), grid=(rows,),
            BLOCK_N=plan.block_n, ONE_PASS=plan.one_pass, **call_options(plan.options),
        )  # fmt: skip
        return y.reshape(x.shape)
    record("softmax", "reference-jnp")
    return jax.nn.softmax(x.astype(compute_dtype(x)), axis=-1).astype(x.dtype)


def _bwd_impl(dy: Any, y: Any) -> Any:
    import jax
    import jax.numpy as jnp

    n = y.shape[-1]
    y2, dy2 = y.reshape(-1, n), dy.reshape(-1, n)
    rows = y2.shape[0]
    if triton_ok(y) and rows > 0:
        import jax_triton as jt

        from greta_core.jax._runtime import jax_arch
        from greta_core.kernels._rows import row_plan
        from greta_core.kernels.softmax import softmax_bwd_kernel

        plan = row_plan("softmax_bwd", jax_arch(), n)
        record("softmax_bwd", "jax-triton", jax_arch())
        dx = jt.triton_call(
            dy2, y2, n, n, n, kernel=softmax_bwd_kernel,
            out_shape=jax.ShapeDtypeStruct(y2.shape, y.dtype), grid=(rows,),
            BLOCK_N=plan.block_n, ONE_PASS=plan.one_pass, **call_options(plan.options),
        )  # fmt: skip
        return dx.reshape(y.shape)
    record("softmax_bwd", "reference-jnp")
    ct = compute_dtype(y)
    yf, dyf = y.astype(ct), dy.astype(ct)
    return (yf * (dyf - jnp.sum(yf * dyf, axis=-1, keepdims=True))).astype(y.dtype)


@functools.cache
def _build() -> Any:
    import jax

    @jax.custom_vjp
    def f(x: Any) -> Any:
        return _fwd_impl(x)

    def fwd(x: Any) -> tuple[Any, Any]:
        y = _fwd_impl(x)
        return y, y

    def bwd(y: Any, dy: Any) -> tuple[Any]:
        return (_bwd_impl(dy, y),)

    f.defvjp(fwd, bwd)
    return f


def softmax(x: Any) -> Any:
    """Numerically stable softmax over the last dim; differentiable (custom_vjp)."""
    check_rows("softmax", "x", x)
    return _build()(x)
