"""add_rms_norm: ``(y, s) = (rms_norm(x + residual) * weight, x + residual)``, the residual
add of a pre-norm transformer fused into the next norm. The declarations of
greta::add_rms_norm (its forward greta::add_rms_norm_fwd also returns the fp32 rstd per row)
and of its backward's kernel op greta::add_rms_norm_bwd."""

from __future__ import annotations

from typing import Any

from greta_core.ops import _interp_compat, _norms
from greta_core.ops._norms import check_stats
from greta_core.ops._plan import In, Out, Plan, Wrap, _identity
from greta_core.ops._rows import (
    arch_for,
    check_array_param,
    check_array_rows,
    check_arrays_alike,
    check_rows_input,
    check_vector,
    norm_bwd_plan,
    param_dtypes,
    row_kernel_plan,
    rows_stride,
)
from greta_core.ops._validate import check_same_device, check_same_shape, check_tensor
from greta_core.ops.declare import Backward, Meta

OP = "add_rms_norm"
_interp_compat.apply()


def validate(x: Any, residual: Any, weight: Any, eps: float = 1e-6, reference: bool = False) -> str:
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
    check_stats(OP, s, reference, rstd=rstd)
    check_same_device(OP, dy=dy, ds=ds, s=s, weight=weight, rstd=rstd)
    return arch_for(OP, s, reference)


def check_arrays(x: Any, residual: Any, weight: Any, eps: float) -> None:
    check_array_rows(OP, "x", x)
    check_array_rows(OP, "residual", residual)
    check_arrays_alike(OP, "x", x, "residual", residual)
    check_array_param(OP, "weight", weight, x)


# --- launch plans: (x, residual [..., N], weight) and (dy, ds, s, weight, rstd) -----------


def plan_fwd(arch: str, x: Meta, residual: Meta, weight: Meta, eps: float, stats: bool) -> Plan:
    """Buffers: y, s (x's shape), with `stats` rstd fp32 [rows]."""
    from greta_core.kernels.add_rms_norm import add_rms_norm_fwd_kernel

    args = (
        In(0), In(1), In(2), x.shape[-1], rows_stride(x), rows_stride(residual), eps, Out(0),
        Out(1), Out(2 if stats else 0),
    )  # fmt: skip
    return row_kernel_plan(
        OP, arch, add_rms_norm_fwd_kernel, x, args, {"STORE_RSTD": stats}, 2, stats
    )


def plan_bwd(arch: str, dy: Meta, ds: Meta, s: Meta, weight: Meta, rstd: Meta) -> Plan:
    """Buffers: dx (also the residual's gradient), fp32 dweight partials (scratch), dweight
    (``norm_bwd_plan``: s's row stride is N, the kernel's own)."""
    from greta_core.kernels.add_rms_norm import add_rms_norm_bwd_kernel

    return norm_bwd_plan(
        "add_rms_norm_bwd", add_rms_norm_bwd_kernel, 5, 1, s.shape,
        (rows_stride(dy), rows_stride(ds)), s.dtype, weight.dtype, arch, weight=3,
    )  # fmt: skip


# --- the declarations -------------------------------------------------------------------


def _grads(call: Any, grads: tuple[Any, ...], saved: Any) -> tuple[Any, ...]:
    dy, ds = (call.dense(g, saved.out1) for g in grads)
    dx, dw = call(ADD_RMS_NORM_BWD, dy, ds, saved.out1, saved.weight, saved.rstd)
    return dx, dx, dw, None


ADD_RMS_NORM, ADD_RMS_NORM_BWD = _norms.declare_norm(
    __name__, "Tensor x, Tensor residual, Tensor weight, float eps=1e-06 -> (Tensor, Tensor)",
    "(RMSNorm(x + residual) * weight, x + residual) over the last dim",
    Backward(_grads, saves=("weight", "rstd"), saves_outputs=(1,)), ("rstd",),
    bwd=("Tensor dy, Tensor ds, Tensor s, Tensor weight, Tensor rstd -> (Tensor, Tensor)",
         "the add_rms_norm backward: (dx, dweight); dx is the residual's gradient too"),
)  # fmt: skip

# The call caches the torch fronts take (y and s only: no backward follows) and tests reach.
_fwd_call, _y_call = ADD_RMS_NORM.call_stats, ADD_RMS_NORM.call


# --- the raw API (torch tensors, no autograd) ----------------------------------------------


def add_rms_norm(x: Any, residual: Any, weight: Any, eps: float = 1e-6) -> tuple[Any, Any]:
    """(y, s): s = x + residual, y = RMSNorm(s) * weight over the last dim. No autograd.

    Raises GretaInputError for a wrong shape, dtype, device or layout.
    """
    return ADD_RMS_NORM.raw(x, residual, weight, eps)


def add_rms_norm_fwd(
    x: Any, residual: Any, weight: Any, eps: float = 1e-6, wrap: Wrap = _identity
) -> tuple[Any, Any, Any]:
    """(y, s, rstd): s = x + residual, y = s * rstd * weight; rstd fp32 [rows].

    Raises GretaInputError for a wrong shape, dtype, device or layout.
    """
    return ADD_RMS_NORM.raw_fwd(x, residual, weight, eps, wrap=wrap)


def add_rms_norm_if_eager(
    x: Any, residual: Any, weight: Any, eps: float = 1e-6
) -> tuple[Any, Any] | None:
    """:func:`add_rms_norm` for a call :func:`~greta_core.ops._calls.eager_raw` allows (the
    torch.ops front's hot path), else None: the caller then takes its torch op."""
    return _y_call.if_eager(x, residual, weight, float(eps))


def add_rms_norm_bwd(
    dy: Any, ds: Any, s: Any, weight: Any, rstd: Any, wrap: Wrap = _identity
) -> tuple[Any, Any]:
    """(dx, dweight) for dy = dL/dy, ds = dL/ds; dx is also the residual's gradient.

    Raises GretaInputError for a wrong shape, dtype, device or layout.
    """
    return ADD_RMS_NORM_BWD.raw(dy, ds, s, weight, rstd, wrap=wrap)
