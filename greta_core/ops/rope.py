from __future__ import annotations

import math
from typing import Any

from greta_core import configs
from greta_core.configs.blocks import rope_blocks
from greta_core.kernels.rope import rope_kernel, rope_positions_kernel
from greta_core.ops import _interp_compat
from greta_core.ops._calls import ForwardCall, tensors_as_given
from greta_core.ops._plan import Buffer, In, Launch, Out, Plan, Wrap, dtype_name, memo
from greta_core.ops._plan import _identity as _no_wrap
from greta_core.ops._rows import arch_for, float_dtypes, param_dtypes
from greta_core.ops._validate import (
    GretaInputError,
    check_same_device,
    check_tensor,
)

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


def validate(x: Any, cos: Any, sin: Any, reference: bool = False) -> str:
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


def validate_positions(x: Any, positions: Any, theta: float, reference: bool = False) -> str:
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


def table_strides(t: Any, n_tail: int) -> tuple[int, int]:
    """(stride over batch, stride over seq) of a torch cos/sin/positions table; batch stride 0
    broadcasts a missing or size-1 batch."""
    if t.dim() == n_tail + 1:
        return 0, t.stride(0)
    return (0 if t.shape[0] == 1 else t.stride(0)), t.stride(1)


# --- launch plans: inputs (x, cos, sin) and (x, positions) ------------------------------


def _plan(
    op: str, kernel: Any, n_tables: int, middle: tuple[Any, ...],
    shape: tuple[int, ...], x_strides: tuple[int, ...], dtype: str, inverse: bool, arch: str,
) -> Plan:  # fmt: skip
    """x [batch, seq, heads, head_dim] (any strides) -> out, contiguous in x's dtype."""
    batch, seq, heads, head_dim = shape
    config = configs.lookup("rope", arch, {"head_dim": head_dim})
    block_h, block_half = rope_blocks(config, heads, head_dim)
    out_strides = (seq * heads * head_dim, heads * head_dim, head_dim)
    args = (
        In(0), *(In(1 + i) for i in range(n_tables)), seq, heads, head_dim // 2, *x_strides,
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
    return Plan(op, arch, (Buffer(shape, dtype),), () if empty else (launch,), (0,))


@memo
def plan_rope(
    shape: tuple[int, ...], x_strides: tuple[int, ...], table_strides: tuple[int, int],
    dtype: str, inverse: bool, arch: str,
) -> Plan:  # fmt: skip
    """`table_strides`: (batch, seq) strides of cos/sin (which share them)."""
    return _plan("rope", rope_kernel, 2, table_strides, shape, x_strides, dtype, inverse, arch)


@memo
def plan_rope_positions(
    shape: tuple[int, ...], x_strides: tuple[int, ...], pos_strides: tuple[int, int],
    theta: float, dtype: str, inverse: bool, arch: str,
) -> Plan:  # fmt: skip
    middle = (*pos_strides, math.log2(theta))
    return _plan(
        "rope_positions", rope_positions_kernel, 1, middle, shape, x_strides, dtype, inverse, arch
    )


# --- the raw API (torch tensors; the torch ops call these with wrap=wrap_triton) ----------


def _resolve_rope(x: Any, cos: Any, sin: Any, inverse: bool) -> Plan:
    arch = validate(x, cos, sin)
    return plan_rope(
        tuple(x.shape), tuple(x.stride()), table_strides(cos, 1), dtype_name(x.dtype),
        bool(inverse), arch,
    )  # fmt: skip


def _resolve_positions(x: Any, positions: Any, theta: float, inverse: bool) -> Plan:
    arch = validate_positions(x, positions, theta)
    return plan_rope_positions(
        tuple(x.shape), tuple(x.stride()), table_strides(positions, 0), float(theta),
        dtype_name(x.dtype), bool(inverse), arch,
    )  # fmt: skip


# Call signature (x, cos, sin, inverse) / (x, positions, theta, inverse): see ops/_calls.py.
# The plans take the call's tensors as given (any strides): every signature may launch ready.
_rope_call = ForwardCall(_resolve_rope, 3, *tensors_as_given(3))
_positions_call = ForwardCall(_resolve_positions, 2, *tensors_as_given(2))


def rope(x: Any, cos: Any, sin: Any, *, inverse: bool = False, wrap: Wrap = _no_wrap) -> Any:
    """Rotate-half RoPE of x [batch, seq, heads, head_dim] (any strides) by cos/sin
    ([seq, head_dim/2] or [batch|1, seq, head_dim/2]); inverse=True rotates back.

    Raises GretaInputError for a wrong shape, dtype, device or layout.
    """
    return _rope_call.run(wrap, x, cos, sin, bool(inverse))[0]


def rope_if_eager(x: Any, cos: Any, sin: Any, inverse: bool = False) -> Any | None:
    """:func:`rope` for a call :func:`~greta_core.ops._calls.eager_raw` allows (the
    torch.ops front's hot path), else None: the caller then takes its torch op."""
    done = _rope_call.if_eager(x, cos, sin, bool(inverse))
    return None if done is None else done[0]


def rope_positions(
    x: Any, positions: Any, theta: float = 10000.0, *, inverse: bool = False,
    wrap: Wrap = _no_wrap,
) -> Any:  # fmt: skip
    """RoPE with angle pos * theta^(-2i/head_dim) computed in the kernel; positions int32/int64
    [seq] or [batch|1, seq].

    Raises GretaInputError for a wrong shape, dtype, device or layout, or theta <= 1.
    """
    return _positions_call.run(wrap, x, positions, theta, bool(inverse))[0]


def rope_positions_if_eager(
    x: Any, positions: Any, theta: float = 10000.0, inverse: bool = False
) -> Any | None:
    """:func:`rope_positions` for a call ``eager_raw`` allows, else None (see
    :func:`rope_if_eager`)."""
    done = _positions_call.if_eager(x, positions, theta, bool(inverse))
    return None if done is None else done[0]
