"""softmax: validation and the launch plan that the raw API, torch.ops.greta and JAX run."""

from __future__ import annotations

import math
from typing import Any

from greta_core.kernels.softmax import softmax_bwd_kernel, softmax_fwd_kernel
from greta_core.ops import _interp_compat
from greta_core.ops._calls import ForwardCall
from greta_core.ops._plan import Buffer, In, Launch, Out, Plan, Wrap, dtype_name, memo, run
from greta_core.ops._plan import _identity as _no_wrap
from greta_core.ops._rows import arch_for, check_rows_input, row_layout, row_plan, rows_view
from greta_core.ops._validate import check_same_device, check_same_shape, check_tensor

OP = "softmax"
_interp_compat.apply()


def validate(x: Any, reference: bool = False) -> str:
    """Check the inputs; returns the arch to launch on. Raises GretaInputError."""
    check_rows_input(OP, "x", x, reference)
    return arch_for(OP, x, reference)


def validate_bwd(dy: Any, y: Any, reference: bool = False) -> str:
    """Check the inputs; returns the arch to launch on. Raises GretaInputError."""
    check_rows_input(OP, "y", y, reference)
    check_rows_input(OP, "dy", dy, reference)
    check_tensor(OP, "dy", dy, dtypes=(y.dtype,))
    check_same_shape(OP, dy=dy, y=y)
    check_same_device(OP, dy=dy, y=y)
    return arch_for(OP, y, reference)


# --- launch plans: inputs (x2 [rows, N]) and (dy2, y2) ---------------------------------


@memo
def plan_fwd(shape: tuple[int, ...], stride_x: int, dtype: str, arch: str) -> Plan:
    """Buffers: y (x's shape and dtype)."""
    n_rows, n_cols = math.prod(shape[:-1]), shape[-1]
    rp = row_plan(OP, arch, n_cols)
    launch = Launch(
        softmax_fwd_kernel, (n_rows,), (In(0), n_cols, stride_x, Out(0)),
        {"BLOCK_N": rp.block_n, "ONE_PASS": rp.one_pass}, rp.options,
    )  # fmt: skip
    return Plan(OP, arch, (Buffer(shape, dtype),), (launch,) if n_rows else (), (0,))


@memo
def plan_bwd(shape: tuple[int, ...], stride_dy: int, stride_y: int, dtype: str, arch: str) -> Plan:
    """Buffers: dx (y's shape and dtype)."""
    n_rows, n_cols = math.prod(shape[:-1]), shape[-1]
    rp = row_plan("softmax_bwd", arch, n_cols)
    launch = Launch(
        softmax_bwd_kernel, (n_rows,), (In(0), In(1), n_cols, stride_dy, stride_y, Out(0)),
        {"BLOCK_N": rp.block_n, "ONE_PASS": rp.one_pass}, rp.options,
    )  # fmt: skip
    return Plan("softmax_bwd", arch, (Buffer(shape, dtype),), (launch,) if n_rows else (), (0,))


# --- the raw API (torch tensors; the torch ops call these with wrap=wrap_triton) ----------


def launch_fwd(x2: Any, y2: Any, arch: str, wrap: Wrap = _no_wrap) -> None:
    """Run the forward into a preallocated y2 [rows, N]."""
    plan = plan_fwd(tuple(x2.shape), x2.stride(0), dtype_name(x2.dtype), arch)
    run(plan, (x2,), out=(y2,), wrap=wrap)


def _resolve_fwd(x: Any) -> tuple[Plan, bool]:
    """(plan, whether x must be copied to be seen as [rows, N]) for one call signature."""
    arch = validate(x)
    shape, stride, copies = row_layout(x)
    return plan_fwd(shape, stride, dtype_name(x.dtype), arch), copies


def _given_inputs(resolved: tuple[Plan, bool]) -> tuple[Plan, tuple[int, ...]] | None:
    plan, copies = resolved
    return None if copies else (plan, (0,))


def _inputs(resolved: tuple[Plan, bool], args: tuple[Any, ...]) -> tuple[Plan, tuple[Any, ...]]:
    (plan, copies), (x,) = resolved, args
    return plan, (rows_view(x) if copies else x,)


# Call signature (x,): see ops/_calls.py. Rows copied to flatten get no ready launch.
_fwd_call = ForwardCall(_resolve_fwd, 1, _given_inputs, _inputs)


def softmax(x: Any, wrap: Wrap = _no_wrap) -> Any:
    """Softmax over the last dim of x ([..., N]), fp32 math, output in x's dtype.

    Raises GretaInputError for a wrong shape, dtype, device or layout.
    """
    return _fwd_call.run(wrap, x)[0]


def softmax_if_eager(x: Any) -> Any | None:
    """:func:`softmax` for a call :func:`~greta_core.ops._calls.eager_raw` allows (the
    torch.ops front's hot path), else None: the caller then takes its torch op."""
    done = _fwd_call.if_eager(x)
    return None if done is None else done[0]


def softmax_bwd(dy: Any, y: Any, wrap: Wrap = _no_wrap) -> Any:
    """dx = y * (dy - sum(y * dy, -1)) for y = softmax(x).

    Raises GretaInputError for a wrong shape, dtype, device or layout.
    """
    arch = validate_bwd(dy, y)
    y2, dy2 = rows_view(y), rows_view(dy)
    plan = plan_bwd(tuple(y.shape), dy2.stride(0), y2.stride(0), dtype_name(y.dtype), arch)
    return run(plan, (dy2, y2), wrap=wrap)[0]


def launch_bwd(dy2: Any, y2: Any, dx2: Any, arch: str, wrap: Wrap = _no_wrap) -> None:
    """Run the backward into a preallocated dx2 [rows, N]."""
    plan = plan_bwd(tuple(y2.shape), dy2.stride(0), y2.stride(0), dtype_name(y2.dtype), arch)
    run(plan, (dy2, y2), out=(dx2,), wrap=wrap)
