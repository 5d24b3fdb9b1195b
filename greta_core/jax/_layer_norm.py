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


def _fwd_impl(x: Any, w: Any, b: Any | None, eps: float) -> tuple[Any, Any, Any]:
    import jax
    import jax.numpy as jnp

    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    rows = x2.shape[0]
    if triton_ok(x, w) and rows > 0:
        import jax_triton as jt

        from greta_core.jax._runtime import jax_arch
        from greta_core.kernels._rows import row_plan
        from greta_core.kernels.layer_norm import layer_norm_fwd_kernel

        plan = row_plan("layer_norm", jax_arch(), n)
        record("layer_norm", "jax-triton", jax_arch())
        stat = jax.ShapeDtypeStruct((rows,), jnp.float32)
        y, mean, rstd = jt.triton_call(
            x2, w, w if b is None else b, n, n, float(eps),
            kernel=layer_norm_fwd_kernel,
            out_shape=[jax.ShapeDtypeStruct(x2.shape, x.dtype), stat, stat],
            grid=(rows,), BLOCK_N=plan.block_n, ONE_PASS=plan.one_pass, HAS_BIAS=b is not None,
            **call_options(plan.options),
        )  # fmt: skip
        return y.reshape(x.shape), mean, rstd
    record("layer_norm", "reference-jnp")
    ct = compute_dtype(x)
    xf = x2.astype(ct)
    mean = jnp.mean(xf, axis=-1)
    xc = xf - mean[:, None]
    rstd = jax.lax.rsqrt(jnp.mean(xc * xc, axis=-1) + eps)
    y = xc * rstd[:, None] * w.astype(ct)
    if b is not None:
        y = y + b.astype(ct)
    return y.astype(x.dtype).reshape(x.shape), mean, rstd


def _bwd_impl(dy: Any, x: Any, w: Any, mean: Any, rstd: Any) -> tuple[Any, Any, Any]:
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
        from greta_core.kernels.layer_norm import layer_norm_bwd_kernel

        arch = jax_arch()
        plan = row_plan("layer_norm_bwd", arch, n)
        programs = bwd_programs(arch, "layer_norm_bwd", rows, n)
        record("layer_norm_bwd", "jax-triton", arch)
        part = jax.ShapeDtypeStruct((programs, n), jnp.float32)
        dx, dw_part, db_part = jt.triton_call(
            dy2, x2, w, mean, rstd, rows, n, n, n,
            kernel=layer_norm_bwd_kernel,
            out_shape=[jax.ShapeDtypeStruct(x2.shape, x.dtype), part, part],
            grid=(programs,), BLOCK_N=plan.block_n, ONE_PASS=plan.one_pass,
            **call_options(plan.options),
        )  # fmt: skip
        cfg = configs.lookup("col_sum", arch, {"N": n})
        sums = [
            jt.triton_call(
                p,
                programs,
                n,
                kernel=col_sum_kernel,
                out_shape=jax.ShapeDtypeStruct((n,), w.dtype),
                grid=col_sum_grid(n, cfg["BLOCK_N"]),
                BLOCK_P=cfg["BLOCK_P"],
                BLOCK_N=cfg["BLOCK_N"],
                **call_options(configs.launch_options(cfg, arch)),
            )
            for p in (dw_part, db_part)
        ]
        return dx.reshape(x.shape), sums[0], sums[1]
    record("layer_norm_bwd", "reference-jnp")
    ct = compute_dtype(x)
    r = rstd.astype(ct)[:, None]
    xhat = (x2.astype(ct) - mean.astype(ct)[:, None]) * r
    dyf = dy2.astype(ct)
    g = dyf * w.astype(ct)
    c1 = jnp.mean(g * xhat, axis=-1, keepdims=True)
    c2 = jnp.mean(g, axis=-1, keepdims=True)
    dx = ((g - xhat * c1 - c2) * r).astype(x.dtype).reshape(x.shape)
    return dx, jnp.sum(dyf * xhat, axis=0).astype(w.dtype), jnp.sum(dyf, axis=0).astype(w.dtype)


@functools.cache
def _build() -> Any:
    import jax

    @functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
    def f(x: Any, w: Any, b: Any, eps: float) -> Any:
        return _fwd_impl(x, w, b, eps)[0]

    def fwd(x: Any, w: Any, b: Any, eps: float) -> tuple[Any, Any]:
        y, mean, rstd = _fwd_impl(x, w, b, eps)
        return y, (x, w, b is not None, mean, rstd)

    def bwd(eps: float, res: Any, dy: Any) -> tuple[Any, Any, Any]:
        x, w, has_bias, mean, rstd = res
        dx, dw, db = _bwd_impl(dy, x, w, mean, rstd)
        return dx, dw, (db if has_bias else None)

    f.defvjp(fwd, bwd)
    return f


def layer_norm(x: Any, weight: Any, bias: Any | None = None, eps: float = 1e-5) -> Any:
    """LayerNorm over the last dim of x ([..., N]); weight/bias [N] (bias may be None)."""
    check_rows("layer_norm", "x", x)
    check_param("layer_norm", "weight", weight, x)
    if bias is not None:
        check_param("layer_norm", "bias", bias, x)
    return _build()(x, weight, bias, float(eps))
