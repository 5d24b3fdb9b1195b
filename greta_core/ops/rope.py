"""RoPE, rotate-half, on x [batch, seq, heads, head_dim]: the declarations of greta::rope
(cos/sin tables) and greta::rope_positions (angles from integer positions in the kernel).
The backward of either is the inverse rotation: the same op with ``inverse`` flipped."""

from __future__ import annotations

import itertools
import math
from typing import Any

from greta_core import configs, reference
from greta_core.configs.blocks import rope_blocks
from greta_core.ops import _interp_compat
from greta_core.ops._plan import Buffer, In, Launch, Out, Plan, Wrap, _identity
from greta_core.ops._rows import TRITON_DTYPE_NAMES, arch_for, float_dtypes, param_dtypes
from greta_core.ops._validate import (
    GretaInputError,
    check_same_device,
    check_tensor,
)
from greta_core.ops.declare import Backward, Meta, OpDecl, declare

_interp_compat.apply()


def check_x(op: str, x: Any, reference: bool = False) -> None:
    check_tensor(op, "x", x, dtypes=float_dtypes(reference), ndim=4)
    if x.shape[-1] % 2:
        raise GretaInputError(
            f"{op}: argument 'x' has head_dim {x.shape[-1]}; RoPE needs an even head_dim "
            "(layout [batch, seq, heads, head_dim])"
        )


def _check_batch(op: str, name: str, t: Any, batch: int, seq: int, tail: tuple[int, ...]) -> None:
    lead = tuple(t.shape[: t.dim() - len(tail)])
    ok = tuple(t.shape[t.dim() - len(tail) :]) == tail and (
        lead == (seq,) or (len(lead) == 2 and lead[0] in (1, batch) and lead[1] == seq)
    )
    if not ok:
        want = ", ".join(map(str, tail))
        sep = ", " if tail else ""
        raise GretaInputError(
            f"{op}: argument '{name}' has shape {tuple(t.shape)}; expected ({seq}{sep}{want}) "
            f"or ({batch} or 1, {seq}{sep}{want})"
        )


def validate(x: Any, cos: Any, sin: Any, inverse: bool = False, reference: bool = False) -> str:
    """Check the inputs; returns the arch to launch on. Raises GretaInputError."""
    check_x("rope", x, reference)
    batch, seq, _, head_dim = x.shape
    for name, t in (("cos", cos), ("sin", sin)):
        check_tensor("rope", name, t, dtypes=param_dtypes(x.dtype), ndim=(2, 3))
        _check_batch("rope", name, t, batch, seq, (head_dim // 2,))
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            raise GretaInputError(f"rope: argument '{name}' must be contiguous in its last dim")
    check_tensor("rope", "sin", sin, dtypes=(cos.dtype,))
    if tuple(sin.shape) != tuple(cos.shape) or sin.stride() != cos.stride():
        raise GretaInputError(
            f"rope: arguments 'cos' {tuple(cos.shape)} and 'sin' {tuple(sin.shape)} must share "
            "shape and strides"
        )
    check_same_device("rope", x=x, cos=cos, sin=sin)
    return arch_for("rope", x, reference)


def validate_positions(
    x: Any, positions: Any, theta: float, inverse: bool = False, reference: bool = False
) -> str:
    """Check the inputs; returns the arch to launch on. Raises GretaInputError."""
    import torch

    check_x("rope_positions", x, reference)
    check_tensor("rope_positions", "positions", positions, dtypes=(torch.int32, torch.int64))
    _check_batch("rope_positions", "positions", positions, x.shape[0], x.shape[1], ())
    if not (isinstance(theta, (int, float)) and math.isfinite(theta) and theta > 1.0):
        raise GretaInputError(
            f"rope_positions: argument 'theta' must be a float > 1, got {theta!r}"
        )
    check_same_device("rope_positions", x=x, positions=positions)
    return arch_for("rope_positions", x, reference)


def table_strides(t: Meta, n_tail: int) -> tuple[int, int]:
    """(stride over batch, stride over seq) of a cos/sin/positions table; batch stride 0
    broadcasts a missing or size-1 batch."""
    if len(t.shape) == n_tail + 1:
        return 0, t.strides[0]
    return (0 if t.shape[0] == 1 else t.strides[0]), t.strides[1]


# --- launch plans: inputs (x, cos, sin) and (x, positions) ------------------------------


def _plan(
    op: str, kernel: Any, n_tables: int, middle: tuple[Any, ...], x: Meta, inverse: bool,
    arch: str,
) -> Plan:  # fmt: skip
    """x [batch, seq, heads, head_dim] (any strides) -> out, contiguous in x's dtype."""
    batch, seq, heads, head_dim = x.shape
    config = configs.lookup("rope", arch, {"head_dim": head_dim})
    block_h, block_half = rope_blocks(config, heads, head_dim)
    out_strides = (seq * heads * head_dim, heads * head_dim, head_dim)
    args = (
        In(0), *(In(1 + i) for i in range(n_tables)), seq, heads, head_dim // 2, *x.strides,
        *middle, *out_strides, Out(0),
    )  # fmt: skip
    launch = Launch(
        kernel,
        (batch * seq, (heads + block_h - 1) // block_h),
        args,
        {"BLOCK_H": block_h, "BLOCK_HALF": block_half, "INVERSE": inverse},
        configs.launch_options(config, arch),
    )
    empty = batch * seq * heads * head_dim == 0
    return Plan(op, arch, (Buffer(x.shape, x.dtype),), () if empty else (launch,), (0,))


def plan_rope(arch: str, x: Meta, cos: Meta, sin: Meta, inverse: bool) -> Plan:
    """cos and sin share shape and strides (validated)."""
    from greta_core.kernels.rope import rope_kernel  # the declaration imports no Triton

    return _plan("rope", rope_kernel, 2, table_strides(cos, 1), x, inverse, arch)


def plan_rope_positions(arch: str, x: Meta, positions: Meta, theta: float, inverse: bool) -> Plan:
    from greta_core.kernels.rope import rope_positions_kernel

    middle = (*table_strides(positions, 0), math.log2(theta))
    return _plan("rope_positions", rope_positions_kernel, 1, middle, x, inverse, arch)


# --- JAX arrays' checks (torch tensors: validate / validate_positions) ---------------------


def _check_array_x(op: str, x: Any) -> None:
    if str(getattr(x, "dtype", "")) not in (*TRITON_DTYPE_NAMES, "float64"):
        raise GretaInputError(f"{op}: argument 'x' has dtype {getattr(x, 'dtype', None)}")
    if x.ndim != 4 or x.shape[-1] % 2:
        raise GretaInputError(
            f"{op}: argument 'x' has shape {x.shape}; expected [batch, seq, heads, head_dim] "
            "with an even head_dim"
        )


def _check_array_table(op: str, name: str, t: Any, x: Any, tail: tuple[int, ...]) -> None:
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


def check_arrays(x: Any, cos: Any, sin: Any, inverse: bool) -> None:
    _check_array_x("rope", x)
    for name, t in (("cos", cos), ("sin", sin)):
        if str(t.dtype) not in (*TRITON_DTYPE_NAMES, "float64"):
            raise GretaInputError(f"rope: argument '{name}' has dtype {t.dtype}")
        _check_array_table("rope", name, t, x, (x.shape[-1] // 2,))
    if sin.shape != cos.shape or sin.dtype != cos.dtype:
        raise GretaInputError("rope: arguments 'cos' and 'sin' must share shape and dtype")


def check_arrays_positions(x: Any, positions: Any, theta: float, inverse: bool) -> None:
    _check_array_x("rope_positions", x)
    if str(getattr(positions, "dtype", "")) not in ("int32", "int64"):
        raise GretaInputError(
            f"rope_positions: argument 'positions' has dtype "
            f"{getattr(positions, 'dtype', type(positions).__name__)}; expected int32 or int64"
        )
    _check_array_table("rope_positions", "positions", positions, x, ())
    if not (math.isfinite(theta) and theta > 1.0):
        raise GretaInputError(f"rope_positions: argument 'theta' must be > 1, got {theta!r}")


# --- what the kernel wheels precompile ------------------------------------------------------

_AOT_HEADS = ((64, 32), (128, 32), (128, 8))  # (head_dim, heads) of the common models


def _aot_rope(arch: str) -> list[tuple[Any, ...]]:
    cases = []
    for (head_dim, heads), dtype, inverse in itertools.product(
        _AOT_HEADS, TRITON_DTYPE_NAMES, (False, True)
    ):
        x = Meta.contiguous((1, 16, heads, head_dim), dtype)
        for table_dtype in sorted({dtype, "float32"}):
            table = Meta.contiguous((16, head_dim // 2), table_dtype)
            cases.append((x, table, table, inverse))
    return cases


def _aot_positions(arch: str) -> list[tuple[Any, ...]]:
    return [
        (
            Meta.contiguous((1, 16, heads, head_dim), dtype),
            Meta.contiguous((16,), pos),
            1e4,
            inverse,
        )
        for (head_dim, heads), dtype, inverse, pos in itertools.product(
            _AOT_HEADS, TRITON_DTYPE_NAMES, (False, True), ("int32", "int64")
        )
    ]


# --- the declarations -------------------------------------------------------------------


def _rope_grads(call: Any, grads: tuple[Any, ...], saved: Any) -> tuple[Any, ...]:
    (dy,) = grads
    return call(ROPE, dy, saved.cos, saved.sin, not saved.inverse), None, None, None


def _positions_grads(call: Any, grads: tuple[Any, ...], saved: Any) -> tuple[Any, ...]:
    (dy,) = grads
    dx = call(ROPE_POSITIONS, dy, saved.positions, saved.theta, not saved.inverse)
    return dx, None, None, None


ROPE = declare(OpDecl(
    name="rope",
    schema="Tensor x, Tensor cos, Tensor sin, bool inverse=False -> Tensor",
    describe="rotary position embedding, rotate-half, x [B,S,H,D]",
    # A lambda: the module's validate as it is at call time (tests count its calls).
    validate=lambda *args, reference=False: validate(*args, reference=reference),
    plan=plan_rope,
    reference=reference.rope,
    backward=Backward(_rope_grads, saves=("cos", "sin")),
    check_arrays=check_arrays,
    aot_cases=_aot_rope,
    aot_unit_ints=True,  # a contiguous x's last stride is 1
))  # fmt: skip

ROPE_POSITIONS = declare(OpDecl(
    name="rope_positions",
    schema="Tensor x, Tensor positions, float theta=10000.0, bool inverse=False -> Tensor",
    describe="rotary position embedding with angles from integer positions, x [B,S,H,D]",
    validate=lambda *args, reference=False: validate_positions(*args, reference=reference),
    plan=plan_rope_positions,
    reference=reference.rope_positions,
    backward=Backward(_positions_grads, saves=("positions",)),
    check_arrays=check_arrays_positions,
    aot_cases=_aot_positions,
    aot_unit_ints=True,  # a contiguous x's last stride and positions' stride are 1
))  # fmt: skip

# The raw API (greta_core.raw) and the call caches the torch fronts and tests reach.
_rope_call, _positions_call = ROPE.call, ROPE_POSITIONS.call


def rope(x: Any, cos: Any, sin: Any, *, inverse: bool = False, wrap: Wrap = _identity) -> Any:
    """Rotate-half RoPE of x [batch, seq, heads, head_dim] (any strides) by cos/sin
    ([seq, head_dim/2] or [batch|1, seq, head_dim/2]); inverse=True rotates back.

    Raises GretaInputError for a wrong shape, dtype, device or layout.
    """
    return ROPE.raw(x, cos, sin, inverse, wrap=wrap)


def rope_if_eager(x: Any, cos: Any, sin: Any, inverse: bool = False) -> Any | None:
    """:func:`rope` for a call :func:`~greta_core.ops._calls.eager_raw` allows (the
    torch.ops front's hot path), else None: the caller then takes its torch op."""
    done = _rope_call.if_eager(x, cos, sin, bool(inverse))
    return None if done is None else done[0]


def rope_positions(
    x: Any, positions: Any, theta: float = 10000.0, *, inverse: bool = False,
    wrap: Wrap = _identity,
) -> Any:  # fmt: skip
    """RoPE with angle pos * theta^(-2i/head_dim) computed in the kernel; positions int32/int64
    [seq] or [batch|1, seq].

    Raises GretaInputError for a wrong shape, dtype, device or layout, or theta <= 1.
    """
    return ROPE_POSITIONS.raw(x, positions, theta, inverse, wrap=wrap)
