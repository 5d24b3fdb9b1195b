from __future__ import annotations

import functools
from typing import Any

from greta_core import reference
from greta_core.jax._rows_common import check_param, check_rows, triton_ok
from greta_core.observe import record


def _fwd_impl(x: Any, w: Any, eps: float) -> tuple[Any, Any]:
    n = x.shape[-1]
    if triton_ok(x, w):
        from greta_core.jax._plan import run
        from greta_core.jax._runtime import jax_arch
        from greta_core.ops.rms_norm import plan_fwd

        plan = plan_fwd(x.shape, n, str(x.dtype), float(eps), jax_arch())
        return run(plan, (x.reshape(-1, n), w))
    record("rms_norm", "reference-jnp")
    return reference.rms_norm_fwd(x, w, eps)


def _bwd_impl(dy: Any, x: Any, w: Any, rstd: Any) -> tuple[Any, Any]:
    n = x.shape[-1]
    if triton_ok(x, w):
        from greta_core.jax._plan import run
        from greta_core.jax._runtime import jax_arch
        from greta_core.ops.rms_norm import plan_bwd

        plan = plan_bwd(x.shape, n, n, str(x.dtype), str(w.dtype), jax_arch())
        return run(plan, (dy.reshape(-1, n), x.reshape(-1, n), w, rstd))
    record("rms_norm_bwd", "reference-jnp")
    return reference.rms_norm_bwd(dy, x, w, rstd)


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
