"""add_rms_norm: validation and the launch plans that the raw API, torch.ops.greta and JAX
run. ``(y, s) = (rms_norm(x + residual) * weight, x + residual)``: the residual add of a
pre-norm transformer fused into the next norm."""

from __future__ import annotations

import math
from typing import Any

from greta_core.errors import GretaInputError
from greta_core.kernels.add_rms_norm import add_rms_norm_bwd_kernel, add_rms_norm_fwd_kernel
from greta_core.ops import _interp_compat
from greta_core.ops._calls import forward_calls
from greta_core.ops._plan import (
    Buffer,
    In,
    Launch,
    Out,
    Plan,
    Wrap,
    dtype_name,
    memo,
    run,
)
from greta_core.ops._plan import _identity as _no_wrap
from greta_core.ops._rows import (
    arch_for,
    bwd_programs,
    check_rows_input,
    check_vector,
    col_sum_launch,
    param_dtypes,
    row_plan,
    row_stride,
    rows_view,
)
from greta_core.ops._validate import (
    check_same_device,
    check_same_shape,
    check_tensor,
)

OP = "add_rms_norm"
_interp_compat.apply()


def _stat_dtypes(reference: bool) -> tuple[Any, ...]:
    import torch

    return (torch.float32, torch.float64) if reference else (torch.float32,)


def validate(x: Any, residual: Any, weight: Any, reference: bool = False) -> str:
    """Check the inputs; returns the arch to launch on. Raises GretaInputError."""
    check_rows_input(OP, "x", x, reference)
    check_rows_input(OP, "residual", residual, reference)
    check_tensor(OP, "residual", residual, dtypes=(x.dtype,))
    check_same_shape(OP, x=x, residual=residual)
    check_vector(OP, "weight", weight, x.shape[-1], param_dtypes(x.dtype))
    check_same_device(OP, x=x, residual=residual, weight=weight)
    return arch_for(OP, x, reference)


def validate_bwd(dy: Any, ds: Any, s: Any, weight: Any, rstd: Any, reference: bool = False) -> str:
    """Check the backward's inputs; returns the arch to launch on. Raises GretaInputError."""
    check_rows_input(OP, "s", s, reference)
    check_tensor(OP, "s", s, contiguous=True)
    check_vector(OP, "weight", weight, s.shape[-1], param_dtypes(s.dtype))
    for name, t in (("dy", dy), ("ds", ds)):
        check_rows_input(OP, name, t, reference)
        check_tensor(OP, name, t, dtypes=(s.dtype,))
    check_same_shape(OP, dy=dy, ds=ds, s=s)
    check_tensor(OP, "rstd", rstd, dtypes=_stat_dtypes(reference), contiguous=True)
    if rstd.numel() != s.numel() // s.shape[-1]:
        raise GretaInputError(
            f"{OP}: argument 'rstd' has {rstd.numel()} elements; expected one per row "
            f"({s.numel() // s.shape[-1]})"
        )
    check_same_device(OP, dy=dy, ds=ds, s=s, weight=weight, rstd=rstd)
    return arch_for(OP, s, reference)


@memo
def plan_fwd(
    shape: tuple[int, ...], stride_x: int, stride_r: int, dtype: str, eps: float, arch: str,
    stats: bool = True,
) -> Plan:  # fmt: skip
    """Inputs (x2, residual2 [rows, N], weight); buffers: y, s (x's shape), rstd fp32 [rows]
    (with `stats`: the backward needs it; a call no backward follows skips it and its store)."""
    n_rows, n_cols = math.prod(shape[:-1]), shape[-1]
    rp = row_plan(OP, arch, n_cols)
    launch = Launch(
        add_rms_norm_fwd_kernel, (n_rows,),
        (In(0), In(1), In(2), n_cols, stride_x, stride_r, eps, Out(0), Out(1),
         Out(2 if stats else 0)),
        {"BLOCK_N": rp.block_n, "ONE_PASS": rp.one_pass, "STORE_RSTD": stats}, rp.options,
    )  # fmt: skip
    buffers = (Buffer(shape, dtype), Buffer(shape, dtype))
    if stats:
        buffers += (Buffer((n_rows,), "float32"),)
    return Plan(OP, arch, buffers, (launch,) if n_rows else (), tuple(range(len(buffers))))


@memo
def plan_bwd(
    shape: tuple[int, ...], stride_dy: int, stride_ds: int, dtype: str, w_dtype: str, arch: str
) -> Plan:
    """Inputs (dy2, ds2, s2, weight, rstd); buffers: dx, fp32 dweight partials (scratch),
    dweight [N]."""
    n_rows, n_cols = math.prod(shape[:-1]), shape[-1]
    rp = row_plan("add_rms_norm_bwd", arch, n_cols)
    programs = bwd_programs(arch, "add_rms_norm_bwd", n_rows, n_cols)
    bwd = Launch(
        add_rms_norm_bwd_kernel, (programs,),
        (In(0), In(1), In(2), In(3), In(4), n_rows, n_cols, stride_dy, stride_ds, Out(0), Out(1)),
        {"BLOCK_N": rp.block_n, "ONE_PASS": rp.one_pass}, rp.options,
    )  # fmt: skip
    buffers = (
        Buffer(shape, dtype),
        Buffer((programs, n_cols), "float32"),
        Buffer((n_cols,), w_dtype, zeroed=n_rows == 0),  # no rows: a zero gradient
    )
    launches = (bwd, col_sum_launch(arch, Out(1), programs, n_cols, Out(2))) if n_rows else ()
    return Plan("add_rms_norm_bwd", arch, buffers, launches, (0, 2))


# --- the raw API (torch tensors; the torch ops call these with wrap=wrap_triton) ----------


def _resolve_fwd(
    x: Any, residual: Any, weight: Any, eps: float, stats: bool
) -> tuple[Plan, bool, bool]:
    """(plan, whether x / residual must be copied to be seen as [rows, N]) for one call
    signature."""
    arch = validate(x, residual, weight)
    shape = tuple(x.shape)
    sx = row_stride(shape, tuple(x.stride()))
    sr = row_stride(shape, tuple(residual.stride()))
    n = shape[-1]
    plan = plan_fwd(
        shape, n if sx is None else sx, n if sr is None else sr, dtype_name(x.dtype), eps, arch,
        stats,
    )  # fmt: skip
    return plan, sx is None, sr is None


def _given_inputs(resolved: tuple[Plan, bool, bool]) -> tuple[Plan, tuple[int, ...]] | None:
    plan, copy_x, copy_r = resolved
    return None if copy_x or copy_r else (plan, (0, 1, 2))


def _inputs(
    resolved: tuple[Plan, bool, bool], args: tuple[Any, ...]
) -> tuple[Plan, tuple[Any, ...]]:
    (plan, copy_x, copy_r), (x, residual, weight, _) = resolved, args
    return plan, (
        rows_view(x) if copy_x else x,
        rows_view(residual) if copy_r else residual,
        weight,
    )


# y and s only (_y_call): the raw API and torch.ops.greta's no-grad path (see ops/_calls.py).
_fwd_call, _y_call = forward_calls(_resolve_fwd, 3, _given_inputs, _inputs)


def add_rms_norm_fwd(
    x: Any, residual: Any, weight: Any, eps: float = 1e-6, wrap: Wrap = _no_wrap
) -> tuple[Any, Any, Any]:
    """(y, s, rstd): s = x + residual, y = s * rstd * weight; rstd fp32 [rows].

    Raises GretaInputError for a wrong shape, dtype, device or layout.
    """
    return _fwd_call.run(wrap, x, residual, weight, float(eps))


def add_rms_norm(x: Any, residual: Any, weight: Any, eps: float = 1e-6) -> tuple[Any, Any]:
    """(y, s): s = x + residual, y = RMSNorm(s) * weight over the last dim. No autograd.

    Raises GretaInputError for a wrong shape, dtype, device or layout.
    """
    y, s = _y_call.run(_no_wrap, x, residual, weight, float(eps))  # no rstd in this plan
    return y, s


def add_rms_norm_if_eager(
    x: Any, residual: Any, weight: Any, eps: float = 1e-6
) -> tuple[Any, Any] | None:
    """:func:`add_rms_norm` for a call :func:`~greta_core.ops._calls.eager_raw` allows (the
    torch.ops front's hot path), else None: the caller then takes its torch op."""
    return _y_call.if_eager(x, residual, weight, float(eps))  # (y, s): no rstd in this plan


def add_rms_norm_bwd(
    dy: Any, ds: Any, s: Any, weight: Any, rstd: Any, wrap: Wrap = _no_wrap
) -> tuple[Any, Any]:
    """(dx, dweight) for dy = dL/dy, ds = dL/ds; dx is also the residual's gradient.

    Raises GretaInputError for a wrong shape, dtype, device or layout.
    """
    arch = validate_bwd(dy, ds, s, weight, rstd)
    dy2, ds2 = rows_view(dy), rows_view(ds)
    plan = plan_bwd(
        tuple(s.shape), dy2.stride(0), ds2.stride(0),
        dtype_name(s.dtype), dtype_name(weight.dtype), arch,
    )  # fmt: skip
    return run(plan, (dy2, ds2, rows_view(s), weight, rstd), wrap=wrap)
