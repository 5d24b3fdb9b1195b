"""greta_core.jax.add_rms_norm: (rms_norm(x + residual) * weight, x + residual),
differentiable (custom_vjp)."""

from __future__ import annotations

import functools
from typing import Any

from greta_core import reference
from greta_core.errors import GretaInputError
from greta_core.jax._rows_common import check_param, check_rows, triton_ok
from greta_core.observe import record


def _fwd_impl(x: Any, r: Any, w: Any, eps: float) -> tuple[Any, Any, Any]:
    n = x.shape[-1]
    if triton_ok(x, r, w):
        from greta_core.jax._plan import run
        from greta_core.jax._runtime import jax_arch
        from greta_core.ops.add_rms_norm import plan_fwd

        plan = plan_fwd(x.shape, n, n, str(x.dtype), float(eps), jax_arch())
        return run(plan, (x.reshape(-1, n), r.reshape(-1, n), w))
    record("add_rms_norm", "reference-jnp")
    return reference.add_rms_norm_fwd(x, r, w, eps)


def _bwd_impl(dy: Any, ds: Any, s: Any, w: Any, rstd: Any) -> tuple[Any, Any]:
    n = s.shape[-1]
    if triton_ok(s, w):
        from greta_core.jax._plan import run
        from greta_core.jax._runtime import jax_arch
        from greta_core.ops.add_rms_norm import plan_bwd

        plan = plan_bwd(s.shape, n, n, str(s.dtype), str(w.dtype), jax_arch())
        return run(plan, (dy.reshape(-1, n), ds.reshape(-1, n), s.reshape(-1, n), w, rstd))
    record("add_rms_norm_bwd", "reference-jnp")
    return reference.add_rms_norm_bwd(dy, ds, s, w, rstd)


@functools.cache
def _build() -> Any:
    import jax

    @functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
    def f(x: Any, r: Any, w: Any, eps: float) -> tuple[Any, Any]:
        y, s, _ = _fwd_impl(x, r, w, eps)
        return y, s

    def fwd(x: Any, r: Any, w: Any, eps: float) -> tuple[Any, Any]:
        y, s, rstd = _fwd_impl(x, r, w, eps)
        return (y, s), (s, w, rstd)

    def bwd(eps: float, res: Any, grads: Any) -> tuple[Any, Any, Any]:
        s, w, rstd = res
        dy, ds = grads
        dx, dw = _bwd_impl(dy, ds, s, w, rstd)
        return dx, dx, dw

    f.defvjp(fwd, bwd)
    return f


def add_rms_norm(x: Any, residual: Any, weight: Any, eps: float = 1e-6) -> tuple[Any, Any]:
    """(y, s): s = x + residual, y = RMSNorm(s) * weight over the last dim; differentiable."""
    check_rows("add_rms_norm", "x", x)
    check_rows("add_rms_norm", "residual", residual)
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise GretaInputError(
            f"add_rms_norm: argument 'residual' {residual.shape} {residual.dtype} must match "
            f"'x' {x.shape} {x.dtype}"
        )
    check_param("add_rms_norm", "weight", weight, x)
    return _build()(x, residual, weight, float(eps))
