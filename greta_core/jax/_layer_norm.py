from __future__ import annotations

import functools
from typing import Any

from greta_core import reference
from greta_core.jax._rows_common import check_param, check_rows, triton_ok
from greta_core.observe import record


def _fwd_impl(x: Any, w: Any, b: Any | None, eps: float) -> tuple[Any, Any, Any]:
    n = x.shape[-1]
    if triton_ok(x, w):
        from greta_core.jax._plan import run
        from greta_core.jax._runtime import jax_arch
        from greta_core.ops.layer_norm import plan_fwd

        plan = plan_fwd(x.shape, n, str(x.dtype), b is not None, float(eps), jax_arch())
        x2 = x.reshape(-1, n)
        return run(plan, (x2, w) if b is None else (x2, w, b))
    record("layer_norm", "reference-jnp")
    return reference.layer_norm_fwd(x, w, b, eps)


def _bwd_impl(dy: Any, x: Any, w: Any, mean: Any, rstd: Any) -> tuple[Any, Any, Any]:
    n = x.shape[-1]
    if triton_ok(x, w):
        from greta_core.jax._plan import run
        from greta_core.jax._runtime import jax_arch
        from greta_core.ops.layer_norm import plan_bwd

        plan = plan_bwd(x.shape, n, n, str(x.dtype), str(w.dtype), jax_arch())
        return run(plan, (dy.reshape(-1, n), x.reshape(-1, n), w, mean, rstd))
    record("layer_norm_bwd", "reference-jnp")
    return reference.layer_norm_bwd(dy, x, w, mean, rstd)


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
