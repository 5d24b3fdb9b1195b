"""greta_core.jax.swiglu / geglu: act(gate) * up, differentiable (custom_vjp)."""

from __future__ import annotations

import functools
from typing import Any

from greta_core import reference
from greta_core.errors import GretaInputError
from greta_core.jax._rows_common import check_float, triton_ok
from greta_core.observe import record
from greta_core.ops.swiglu import OPS


def _fwd_impl(op: str, gate: Any, up: Any) -> Any:
    if triton_ok(gate, up):
        from greta_core.jax._plan import run
        from greta_core.jax._runtime import jax_arch
        from greta_core.ops.swiglu import plan_fwd

        return run(plan_fwd(op, gate.shape, str(gate.dtype), jax_arch()), (gate, up))[0]
    record(op, "reference-jnp")
    return reference.glu(gate, up, OPS[op])


def _bwd_impl(op: str, dy: Any, gate: Any, up: Any) -> tuple[Any, Any]:
    if triton_ok(gate, up):
        from greta_core.jax._plan import run
        from greta_core.jax._runtime import jax_arch
        from greta_core.ops.swiglu import plan_bwd

        return run(plan_bwd(op, gate.shape, str(gate.dtype), jax_arch()), (dy, gate, up))
    record(f"{op}_bwd", "reference-jnp")
    return reference.glu_bwd(dy, gate, up, OPS[op])


@functools.cache
def _build(op: str) -> Any:
    import jax

    @jax.custom_vjp
    def f(gate: Any, up: Any) -> Any:
        return _fwd_impl(op, gate, up)

    def fwd(gate: Any, up: Any) -> tuple[Any, Any]:
        return _fwd_impl(op, gate, up), (gate, up)

    def bwd(res: Any, dy: Any) -> tuple[Any, Any]:
        gate, up = res
        return _bwd_impl(op, dy, gate, up)

    f.defvjp(fwd, bwd)
    return f


def _check(op: str, gate: Any, up: Any) -> None:
    check_float(op, "gate", gate)
    check_float(op, "up", up)
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise GretaInputError(
            f"{op}: arguments 'gate' {gate.shape} {gate.dtype} and 'up' {up.shape} {up.dtype} "
            "must have one shape and dtype"
        )


def swiglu(gate: Any, up: Any) -> Any:
    """silu(gate) * up; differentiable. Raises GretaInputError for a wrong shape or dtype."""
    _check("swiglu", gate, up)
    return _build("swiglu")(gate, up)


def geglu(gate: Any, up: Any) -> Any:
    """gelu_tanh(gate) * up (Gemma's MLP); differentiable."""
    _check("geglu", gate, up)
    return _build("geglu")(gate, up)
