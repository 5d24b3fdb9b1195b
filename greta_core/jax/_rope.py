from __future__ import annotations

import functools
import math
from typing import Any

from greta_core import reference
from greta_core.errors import GretaInputError
from greta_core.jax._rows_common import FLOAT_DTYPES, check_float
from greta_core.observe import record


def _check_x(op: str, x: Any) -> None:
    check_float(op, "x", x)
    if x.ndim != 4 or x.shape[-1] % 2:
        raise GretaInputError(
            f"{op}: argument 'x' has shape {x.shape}; expected [batch, seq, heads, head_dim] "
            "with an even head_dim"
        )


def _check_table(op: str, name: str, t: Any, x: Any, tail: tuple[int, ...]) -> None:
    batch, seq = x.shape[0], x.shape[1]
    lead = t.shape[: t.ndim - len(tail)]
    ok = t.shape[t.ndim - len(tail) :] == tail and (
        lead == (seq,) or (len(lead) == 2 and lead[0] in (1, batch) and lead[1] == seq)
    )
    if not ok:
        raise GretaInputError(
            f"{op}: argument '{name}' has shape {t.shape}; expected [seq{', d/2' if tail else ''}] "
            f"or [batch|1, seq{', d/2' if tail else ''}] for x {x.shape}"
        )


def _batch_stride(t: Any, n_tail: int, seq_stride: int) -> tuple[int, int]:
    if t.ndim == n_tail + 1 or t.shape[0] == 1:
        return 0, seq_stride
    return t.shape[1] * seq_stride, seq_stride


def _triton_ok(x: Any, *tables: Any) -> bool:
    from greta_core.jax._runtime import use_triton

    floats = (x, *(t for t in tables if str(t.dtype) not in ("int32", "int64")))
    return all(str(a.dtype) in FLOAT_DTYPES for a in floats) and use_triton()


def _x_strides(x: Any) -> tuple[int, ...]:
    _, seq, heads, d = x.shape
    return (seq * heads * d, heads * d, d, 1)


def _rope_impl(x: Any, cos: Any, sin: Any, inverse: bool) -> Any:
    if _triton_ok(x, cos, sin):
        from greta_core.jax._plan import run
        from greta_core.jax._runtime import jax_arch
        from greta_core.ops.rope import plan_rope

        strides = _batch_stride(cos, 1, x.shape[-1] // 2)
        plan = plan_rope(x.shape, _x_strides(x), strides, str(x.dtype), inverse, jax_arch())
        return run(plan, (x, cos, sin))[0]
    record("rope", "reference-jnp")
    return reference.rope(x, cos, sin, inverse)


def _rope_positions_impl(x: Any, positions: Any, theta: float, inverse: bool) -> Any:
    if _triton_ok(x, positions):
        from greta_core.jax._plan import run
        from greta_core.jax._runtime import jax_arch
        from greta_core.ops.rope import plan_rope_positions

        plan = plan_rope_positions(
            x.shape, _x_strides(x), _batch_stride(positions, 0, 1), theta, str(x.dtype),
            inverse, jax_arch(),
        )  # fmt: skip
        return run(plan, (x, positions))[0]
    record("rope_positions", "reference-jnp")
    return reference.rope_positions(x, positions, theta, inverse)


@functools.cache
def _build() -> tuple[Any, Any]:
    import jax

    @functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
    def rope_f(x: Any, cos: Any, sin: Any, inverse: bool) -> Any:
        return _rope_impl(x, cos, sin, inverse)

    def rope_fwd(x: Any, cos: Any, sin: Any, inverse: bool) -> tuple[Any, Any]:
        return _rope_impl(x, cos, sin, inverse), (cos, sin)

    def rope_bwd(inverse: bool, res: Any, dy: Any) -> tuple[Any, Any, Any]:
        cos, sin = res
        return _rope_impl(dy, cos, sin, not inverse), None, None

    rope_f.defvjp(rope_fwd, rope_bwd)

    @functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
    def pos_f(x: Any, positions: Any, theta: float, inverse: bool) -> Any:
        return _rope_positions_impl(x, positions, theta, inverse)

    def pos_fwd(x: Any, positions: Any, theta: float, inverse: bool) -> tuple[Any, Any]:
        return _rope_positions_impl(x, positions, theta, inverse), positions

    def pos_bwd(theta: float, inverse: bool, positions: Any, dy: Any) -> tuple[Any, Any]:
        return _rope_positions_impl(dy, positions, theta, not inverse), None

    pos_f.defvjp(pos_fwd, pos_bwd)
    return rope_f, pos_f


def rope(x: Any, cos: Any, sin: Any, inverse: bool = False) -> Any:
    """Rotate-half RoPE of x [batch, seq, heads, head_dim] by cos/sin [seq, d/2] or
    [batch|1, seq, d/2]; differentiable in x (custom_vjp: the inverse rotation)."""
    _check_x("rope", x)
    for name, t in (("cos", cos), ("sin", sin)):
        check_float("rope", name, t)
        _check_table("rope", name, t, x, (x.shape[-1] // 2,))
    if sin.shape != cos.shape or sin.dtype != cos.dtype:
        raise GretaInputError("rope: arguments 'cos' and 'sin' must share shape and dtype")
    return _build()[0](x, cos, sin, bool(inverse))


def rope_positions(x: Any, positions: Any, theta: float = 10000.0, inverse: bool = False) -> Any:
    """RoPE with angles pos * theta^(-2i/head_dim) from integer positions [seq] or
    [batch|1, seq]; computed inside the kernel on the Triton path."""
    _check_x("rope_positions", x)
    if str(getattr(positions, "dtype", "")) not in ("int32", "int64"):
        raise GretaInputError(
            f"rope_positions: argument 'positions' has dtype "
            f"{getattr(positions, 'dtype', type(positions).__name__)}; expected int32 or int64"
        )
    _check_table("rope_positions", "positions", positions, x, ())
    if not (math.isfinite(theta) and theta > 1.0):
        raise GretaInputError(f"rope_positions: argument 'theta' must be > 1, got {theta!r}")
    return _build()[1](x, positions, float(theta), bool(inverse))
