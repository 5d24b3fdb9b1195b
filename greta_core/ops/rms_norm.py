"""rms_norm: validation and the launch plan that the raw API, torch.ops.greta and JAX run."""

from __future__ import annotations

import math
from typing import Any

from greta_core.kernels.rms_norm import rms_norm_bwd_kernel, rms_norm_fwd_kernel
from greta_core.ops import _interp_compat
from greta_core.ops._calls import forward_calls
from greta_core.ops._plan import Buffer, In, Launch, Out, Plan, Wrap, dtype_name, memo, run
from greta_core.ops._plan import _identity as _no_wrap
from greta_core.ops._rows import (
    arch_for,
    check_rows_input,
    check_vector,
    norm_bwd_plan,
    param_dtypes,
    row_layout,
    row_plan,
    rows_view,
    stat_dtypes,
)
from greta_core.ops._validate import (
    GretaInputError,
    check_same_device,
    check_same_shape,
    check_tensor,
)

OP = "rms_norm"
_interp_compat.apply()


def validate(x: Any, weight: Any, reference: bool = False) -> str:
    """Check the inputs; returns the arch to launch on. Raises GretaInputError."""
    check_rows_input(OP, "x", x, reference)
    check_vector(OP, "weight", weight, x.shape[-1], param_dtypes(x.dtype))
    check_same_device(OP, x=x, weight=weight)
    return arch_for(OP, x, reference)


def validate_bwd(dy: Any, x: Any, weight: Any, rstd: Any, reference: bool = False) -> str:
    """Check the backward's inputs; returns the arch to launch on. Raises GretaInputError."""
    check_rows_input(OP, "x", x, reference)
    check_vector(OP, "weight", weight, x.shape[-1], param_dtypes(x.dtype))
    check_rows_input(OP, "dy", dy, reference)
    check_tensor(OP, "dy", dy, dtypes=(x.dtype,))
    check_same_shape(OP, dy=dy, x=x)
    check_tensor(OP, "rstd", rstd, dtypes=stat_dtypes(reference), contiguous=True)
    if rstd.numel() != x.numel() // x.shape[-1]:
        raise GretaInputError(
            f"{OP}: argument 'rstd' has {rstd.numel()} elements; expected one per row "
            f"({x.numel() // x.shape[-1]})"
        )
    check_same_device(OP, dy=dy, x=x, rstd=rstd)
    return arch_for(OP, x, reference)


# --- launch plans: inputs (x2 [rows, N], weight [N]) and (dy2, x2, weight, rstd) ----------


@memo
def plan_fwd(
    shape: tuple[int, ...], stride_x: int, dtype: str, eps: float, arch: str,
    stats: bool = True,
) -> Plan:  # fmt: skip
    """Buffers: y (x's shape and dtype), rstd fp32 [rows] (with `stats`: the backward
    needs it; a call no backward follows skips the buffer and the store)."""
    n_rows, n_cols = math.prod(shape[:-1]), shape[-1]
    rp = row_plan(OP, arch, n_cols)
    launch = Launch(
        rms_norm_fwd_kernel, (n_rows,),
        (In(0), In(1), n_cols, stride_x, eps, Out(0), Out(1 if stats else 0)),
        {"BLOCK_N": rp.block_n, "ONE_PASS": rp.one_pass, "STORE_RSTD": stats},
        rp.options,
    )  # fmt: skip
    buffers = (Buffer(shape, dtype),)
    if stats:
        buffers += (Buffer((n_rows,), "float32"),)
    return Plan(OP, arch, buffers, (launch,) if n_rows else (), tuple(range(len(buffers))))


@memo
def plan_bwd(
    shape: tuple[int, ...], stride_dy: int, stride_x: int, dtype: str, w_dtype: str, arch: str
) -> Plan:
    """Inputs (dy2, x2, weight, rstd); buffers: dx (x's shape), fp32 partials, dweight."""
    return norm_bwd_plan(
        "rms_norm_bwd", rms_norm_bwd_kernel, 4, 1, shape, stride_dy, stride_x, dtype, w_dtype, arch
    )


# --- the raw API (torch tensors; the torch ops call these with wrap=wrap_triton) ----------


def launch_fwd(
    x2: Any, weight: Any, eps: float, y2: Any, rstd: Any, arch: str, wrap: Wrap = _no_wrap
) -> None:
    """Run the forward into preallocated y2 [rows, N] and rstd fp32 [rows]."""
    plan = plan_fwd(tuple(x2.shape), x2.stride(0), dtype_name(x2.dtype), float(eps), arch)
    run(plan, (x2, weight), out=(y2, rstd), wrap=wrap)


def _resolve_fwd(x: Any, weight: Any, eps: float, stats: bool) -> tuple[Plan, bool]:
    """(plan, whether x must be copied to be seen as [rows, N]) for one call signature."""
    arch = validate(x, weight)
    shape, stride, copies = row_layout(x)
    return plan_fwd(shape, stride, dtype_name(x.dtype), eps, arch, stats), copies


def _given_inputs(resolved: tuple[Plan, bool]) -> tuple[Plan, tuple[int, ...]] | None:
    plan, copies = resolved
    return None if copies else (plan, (0, 1))


def _inputs(resolved: tuple[Plan, bool], args: tuple[Any, ...]) -> tuple[Plan, tuple[Any, ...]]:
    (plan, copies), (x, weight, _) = resolved, args
    return plan, (rows_view(x) if copies else x, weight)


# y only (_y_call): the raw API and torch.ops.greta's no-grad path (see ops/_calls.py).
_fwd_call, _y_call = forward_calls(_resolve_fwd, 2, _given_inputs, _inputs)


def rms_norm_fwd(x: Any, weight: Any, eps: float = 1e-6, wrap: Wrap = _no_wrap) -> tuple[Any, Any]:
    """(y, rstd): y = x * rstd * weight over the last dim; rstd fp32 [rows].

    Raises GretaInputError for a wrong shape, dtype, device or layout.
    """
    return _fwd_call.run(wrap, x, weight, float(eps))


def rms_norm(x: Any, weight: Any, eps: float = 1e-6) -> Any:
    """RMSNorm over the last dim of x ([..., N]); weight [N]. No autograd (see torch.ops).

    Raises GretaInputError for a wrong shape, dtype, device or layout.
    """
    return _y_call.run(_no_wrap, x, weight, float(eps))[0]


def rms_norm_if_eager(x: Any, weight: Any, eps: float = 1e-6) -> Any | None:
    """:func:`rms_norm` for a call :func:`~greta_core.ops._calls.eager_raw` allows (the
    torch.ops front's hot path), else None: the caller then takes its torch op."""
    done = _y_call.if_eager(x, weight, float(eps))
    return None if done is None else done[0]


def rms_norm_bwd(dy: Any, x: Any, weight: Any, rstd: Any, wrap: Wrap = _no_wrap) -> tuple[Any, Any]:
    """(dx, dweight) for dy = dL/dy; deterministic (fixed-order partial sums).

    Raises GretaInputError for a wrong shape, dtype, device or layout.
    """
    arch = validate_bwd(dy, x, weight, rstd)
    x2, dy2 = rows_view(x), rows_view(dy)
    plan = plan_bwd(
        tuple(x.shape), dy2.stride(0), x2.stride(0),
        dtype_name(x.dtype), dtype_name(weight.dtype), arch,
    )  # fmt: skip
    return run(plan, (dy2, x2, weight, rstd), wrap=wrap)
