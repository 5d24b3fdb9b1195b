from __future__ import annotations

import functools
from typing import Any

from greta_core import reference
from greta_core.jax._rows_common import check_rows, triton_ok
from greta_core.observe import record


def _fwd_impl(x: Any) -> Any:
    n = x.shape[-1]
    if triton_ok(x):
        from greta_core.jax._plan import run
        from greta_core.jax._runtime import jax_arch
        from greta_core.ops.softmax import plan_fwd

        return run(plan_fwd(x.shape, n, str(x.dtype), jax_arch()), (x.reshape(-1, n),))[0]
    record("softmax", "reference-jnp")
    return reference.softmax(x)


def _bwd_impl(dy: Any, y: Any) -> Any:
    n = y.shape[-1]
    if triton_ok(y):
        from greta_core.jax._plan import run
        from greta_core.jax._runtime import jax_arch
        from greta_core.ops.softmax import plan_bwd

        plan = plan_bwd(y.shape, n, n, str(y.dtype), jax_arch())
        return run(plan, (dy.reshape(-1, n), y.reshape(-1, n)))[0]
    record("softmax_bwd", "reference-jnp")
    return reference.softmax_bwd(dy, y)


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
