"""layer_norm: validation and the launch plan that the raw API, torch.ops.greta and JAX run."""

from __future__ import annotations

import math
from typing import Any

from greta_core.kernels.layer_norm import layer_norm_bwd_kernel, layer_norm_fwd_kernel
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

OP = "layer_norm"
_interp_compat.apply()


def validate(x: Any, weight: Any, bias: Any | None, reference: bool = False) -> str:
    """Check the inputs; returns the arch to launch on. Raises GretaInputError."""
    check_rows_input(OP, "x", x, reference)
    check_vector(OP, "weight", weight, x.shape[-1], param_dtypes(x.dtype))
    if bias is not None:
        check_vector(OP, "bias", bias, x.shape[-1], (weight.dtype,))
    check_same_device(OP, x=x, weight=weight, bias=bias)
    return arch_for(OP, x, reference)


def validate_bwd(
    dy: Any, x: Any, weight: Any, mean: Any, rstd: Any, reference: bool = False
) -> str:
    """Check the backward's inputs; returns the arch to launch on. Raises GretaInputError."""
    check_rows_input(OP, "x", x, reference)
    check_vector(OP, "weight", weight, x.shape[-1], param_dtypes(x.dtype))
    check_rows_input(OP, "dy", dy, reference)
    check_tensor(OP, "dy", dy, dtypes=(x.dtype,))
    check_same_shape(OP, dy=dy, x=x)
    rows = x.numel() // x.shape[-1]
    for name, t in (("mean", mean), ("rstd", rstd)):
        check_tensor(OP, name, t, dtypes=stat_dtypes(reference), contiguous=True)
        if t.numel() != rows:
            raise GretaInputError(
                f"{OP}: argument '{name}' has {t.numel()} elements; expected one per row ({rows})"
            )
    check_same_device(OP, dy=dy, x=x, mean=mean, rstd=rstd)
    return arch_for(OP, x, reference)


# --- launch plans: inputs (x2 [rows, N], weight, bias) and (dy2, x2, weight, mean, rstd) --


@memo
def plan_fwd(
    shape: tuple[int, ...], stride_x: int, dtype: str, has_bias: bool, eps: float, arch: str,
    stats: bool = True,
) -> Plan:  # fmt: skip
    """Buffers: y (x's shape and dtype), mean and rstd fp32 [rows] (with `stats`: the
    backward needs them; a call no backward follows skips the buffers and the stores).
    Without a bias the kernel gets the weight in its place (never read: HAS_BIAS is False)."""
    n_rows, n_cols = math.prod(shape[:-1]), shape[-1]
    rp = row_plan(OP, arch, n_cols)
    mean, rstd = (Out(1), Out(2)) if stats else (Out(0), Out(0))
    launch = Launch(
        layer_norm_fwd_kernel, (n_rows,),
        (In(0), In(1), In(2 if has_bias else 1), n_cols, stride_x, eps, Out(0), mean, rstd),
        {"BLOCK_N": rp.block_n, "ONE_PASS": rp.one_pass, "HAS_BIAS": has_bias,
         "STORE_STATS": stats},
        rp.options,
    )  # fmt: skip
    buffers = (Buffer(shape, dtype),)
    if stats:
        buffers += (Buffer((n_rows,), "float32"),) * 2
    return Plan(OP, arch, buffers, (launch,) if n_rows else (), tuple(range(len(buffers))))


@memo
def plan_bwd(
    shape: tuple[int, ...], stride_dy: int, stride_x: int, dtype: str, w_dtype: str, arch: str
) -> Plan:
    """Inputs (dy2, x2, weight, mean, rstd); buffers: dx, fp32 partials, dweight, dbias."""
    return norm_bwd_plan(
        "layer_norm_bwd", layer_norm_bwd_kernel, 5, 2, shape, stride_dy, stride_x, dtype,
        w_dtype, arch,
    )  # fmt: skip


# --- the raw API (torch tensors; the torch ops call these with wrap=wrap_triton) ----------


def _inputs(x2: Any, weight: Any, bias: Any | None) -> tuple[Any, ...]:
    return (x2, weight) if bias is None else (x2, weight, bias)


def launch_fwd(
    x2: Any, weight: Any, bias: Any | None, eps: float, y2: Any, mean: Any, rstd: Any,
    arch: str, wrap: Wrap = _no_wrap,
) -> None:  # fmt: skip
    """Run the forward into preallocated y2 [rows, N], mean and rstd fp32 [rows]."""
    plan = plan_fwd(
        tuple(x2.shape), x2.stride(0), dtype_name(x2.dtype), bias is not None, float(eps), arch
    )
    run(plan, _inputs(x2, weight, bias), out=(y2, mean, rstd), wrap=wrap)


def _resolve_fwd(
    x: Any, weight: Any, bias: Any | None, eps: float, stats: bool
) -> tuple[Plan, bool, bool]:
    """(plan, whether x must be copied to be seen as [rows, N], whether there is a bias)
    for one call signature."""
    arch = validate(x, weight, bias)
    shape, stride, copies = row_layout(x)
    has_bias = bias is not None
    plan = plan_fwd(shape, stride, dtype_name(x.dtype), has_bias, eps, arch, stats)
    return plan, copies, has_bias


def _given_inputs(resolved: tuple[Plan, bool, bool]) -> tuple[Plan, tuple[int, ...]] | None:
    plan, copies, has_bias = resolved
    return None if copies else (plan, (0, 1, 2) if has_bias else (0, 1))


def _ordinary_inputs(
    resolved: tuple[Plan, bool, bool], args: tuple[Any, ...]
) -> tuple[Plan, tuple[Any, ...]]:
    (plan, copies, _), (x, weight, bias, _) = resolved, args
    return plan, _inputs(rows_view(x) if copies else x, weight, bias)


# y only (_y_call): the raw API and torch.ops.greta's no-grad path (see ops/_calls.py).
_fwd_call, _y_call = forward_calls(_resolve_fwd, 3, _given_inputs, _ordinary_inputs)


def layer_norm_fwd(
    x: Any, weight: Any, bias: Any | None = None, eps: float = 1e-5, wrap: Wrap = _no_wrap
) -> tuple[Any, Any, Any]:
    """(y, mean, rstd): y = (x - mean) * rstd * weight + bias; mean/rstd fp32 [rows].

    Raises GretaInputError for a wrong shape, dtype, device or layout.
    """
    return _fwd_call.run(wrap, x, weight, bias, float(eps))


def layer_norm(x: Any, weight: Any, bias: Any | None = None, eps: float = 1e-5) -> Any:
    """LayerNorm over the last dim of x ([..., N]); weight/bias [N]. No autograd.

    Raises GretaInputError for a wrong shape, dtype, device or layout.
    """
    return _y_call.run(_no_wrap, x, weight, bias, float(eps))[0]


def layer_norm_if_eager(
    x: Any, weight: Any, bias: Any | None = None, eps: float = 1e-5
) -> Any | None:
    """:func:`layer_norm` for a call :func:`~greta_core.ops._calls.eager_raw` allows (the
    torch.ops front's hot path), else None: the caller then takes its torch op."""
    done = _y_call.if_eager(x, weight, bias, float(eps))
    return None if done is None else done[0]


def layer_norm_bwd(
    dy: Any, x: Any, weight: Any, mean: Any, rstd: Any, wrap: Wrap = _no_wrap
) -> tuple[Any, Any, Any]:
    """(dx, dweight, dbias); deterministic (fixed-order partial sums). dbias in weight dtype.

    Raises GretaInputError for a wrong shape, dtype, device or layout.
    """
    arch = validate_bwd(dy, x, weight, mean, rstd)
    x2, dy2 = rows_view(x), rows_view(dy)
    plan = plan_bwd(
        tuple(x.shape), dy2.stride(0), x2.stride(0),
        dtype_name(x.dtype), dtype_name(weight.dtype), arch,
    )  # fmt: skip
    return run(plan, (dy2, x2, weight, mean, rstd), wrap=wrap)
