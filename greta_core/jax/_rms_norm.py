from __future__ import annotations

import functools
from typing import Any

from greta_core.jax._rows_common import (
    call_options,
    check_param,
    check_rows,
    compute_dtype,
    triton_ok,
)
from greta_core.observe import record


def _fwd_impl(x: Any, w: Any, eps: float) -> tuple[Any, Any]:
    import jax
    import jax.numpy as jnp

    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    rows = x2.shape[0]
    if triton_ok(x, w) and rows > 0:
        import jax_triton as jt

        from greta_core.jax._runtime import jax_arch
        from greta_core.kernels._rows import row_plan
        from greta_core.kernels.rms_norm import rms_norm_fwd_kernel

        plan = row_plan("rms_norm", jax_arch(), n)
        record("rms_norm", "jax-triton", jax_arch())
        y, rstd = jt.triton_call(
            x2, w, n, n, float(eps),
            kernel=rms_norm_fwd_kernel,
            out_shape=[jax.ShapeDtypeStruct(x2.shape, x.dtype), jax.ShapeDtypeStruct((rows,), jnp.float32)],
            grid=(rows,), BLOCK_N=plan.block_n, ONE_PASS=plan.one_pass, **call_options(plan.options),
        )  # fmt: skip
        return y.reshape(x.shape), rstd
    record("rms_norm", "reference-jnp")
    ct = compute_dtype(x)
    xf = x2.astype(ct)
    rstd = jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1) + eps)
    return (xf * rstd[:, None] * w.astype(ct)).astype(x.dtype).reshape(x.shape), rstd


def _bwd_impl(dy: Any, x: Any, w: Any, rstd: Any) -> tuple[Any, Any]:
    import jax
    import jax.numpy as jnp

    n = x.shape[-1]
    x2, dy2 = x.reshape(-1, n), dy.reshape(-1, n)
    rows = x2.shape[0]
    if triton_ok(x, w) and rows > 0:
        import jax_triton as jt

        from greta_core import configs
        from greta_core.jax._runtime import jax_arch
        from greta_core.kernels._rows import bwd_programs, row_plan
        from greta_core.kernels.col_sum import col_sum_kernel
        from greta_core.kernels.col_sum import grid as col_sum_grid
        from greta_core.kernels.rms_norm import rms_norm_bwd_kernel

        arch = jax_arch()
        plan = row_plan("rms_norm_bwd", arch, n)
        programs = bwd_programs(arch, "rms_norm_bwd", rows, n)
        record("rms_norm_bwd", "jax-triton", arch)
        dx, partial = jt.triton_call(
            dy2, x2, w, rstd, rows, n, n, n,
            kernel=rms_norm_bwd_kernel,
            out_shape=[jax.ShapeDtypeStruct(x2.shape, x.dtype), jax.ShapeDtypeStruct((programs, n), jnp.float32)],
            grid=(programs,), BLOCK_N=plan.block_n, ONE_PASS=plan.one_pass, **call_options(plan.options),
        )  # fmt: skip
        cfg = configs.lookup("col_sum", arch, {"N": n})
        dw = jt.triton_call(
            partial, programs, n,
            kernel=col_sum_kernel, out_shape=jax.ShapeDtypeStruct((n,), w.dtype),
            grid=col_sum_grid(n, cfg["BLOCK_N"]), BLOCK_P=cfg["BLOCK_P"], BLOCK_N=cfg["BLOCK_N"],
            **call_options(configs.launch_options(cfg, arch)),
        )  # fmt: skip
        return dx.reshape(x.shape), dw
    record("rms_norm_bwd", "reference-jnp")
    ct = compute_dtype(x)
    r = rstd.astype(ct)[:, None]
    xhat = x2.astype(ct) * r
    dyf = dy2.astype(ct)
    g = dyf * w.astype(ct)
    c = jnp.mean(g * xhat, axis=-1, keepdims=True)
    dx = ((g - xhat * c) * r).astype(x.dtype).reshape(x.shape)
    return dx, jnp.sum(dyf * xhat, axis=0).astype(w.dtype)


@functools.cache
def _build() -> Any:
    import jax

    @functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
    def f(x: Any, w: Any, eps: float) -> Any:
        return _fwd_impl(x, w, eps)[0]

    def fwd(x: Any, w: Any, eps: float) -> tuple[Any, Any]:
        y, rstd = _fwd_impl(x, w, eps)
        return y, (x, w, rstd)

    def bwd(eps: float, res: Any, dy: Any) -> tuple[Any, Any]:
        x, w, rstd = res
        return _bwd_impl(dy, x, w, rstd)

    f.defvjp(fwd, bwd)
    return f


def rms_norm(x: Any, weight: Any, eps: float = 1e-6) -> Any:
    """RMSNorm over the last dim of x ([..., N]), weight [N]; differentiable (custom_vjp)."""
    check_rows("rms_norm", "x", x)
    check_param("rms_norm", "weight", weight, x)
    return _build()(x, weight, float(eps))
