"""RMSNorm over the last dim: the declarations of greta::rms_norm (y; its forward
greta::rms_norm_fwd also returns the fp32 rstd per row the backward reads) and of its
backward's kernel op greta::rms_norm_bwd."""

from __future__ import annotations

from typing import Any

from greta_core.ops import _interp_compat, _norms, _torch_eager
from greta_core.ops._plan import In, Out, Plan, Wrap, _identity
from greta_core.ops._rows import row_kernel_plan, rows_stride
from greta_core.ops.declare import Backward, Meta

OP = "rms_norm"
_interp_compat.apply()


def validate(x: Any, weight: Any, eps: float = 1e-6, reference: bool = False) -> str:
    """Check the inputs; returns the arch to launch on. Raises GretaInputError."""
    return _norms.validate_fwd(OP, x, weight, None, reference)


def validate_bwd(dy: Any, x: Any, weight: Any, rstd: Any, reference: bool = False) -> str:
    """Check the backward's inputs; returns the arch to launch on. Raises GretaInputError."""
    return _norms.validate_bwd(OP, dy, x, weight, reference, rstd=rstd)


def check_arrays(x: Any, weight: Any, eps: float) -> None:
    _norms.check_arrays(OP, x, weight)


# --- launch plans: (x [..., N], weight [N]) and (dy, x, weight, rstd) ---------------------


def plan_fwd(arch: str, x: Meta, weight: Meta, eps: float, stats: bool) -> Plan:
    """Buffers: y (x's shape and dtype), with `stats` rstd fp32 [rows] (without, the kernel
    gets y's pointer for it and STORE_RSTD off)."""
    from greta_core.kernels.rms_norm import rms_norm_fwd_kernel  # the declaration imports no Triton

    args = (In(0), In(1), x.shape[-1], rows_stride(x), eps, Out(0), Out(1 if stats else 0))
    return row_kernel_plan(OP, arch, rms_norm_fwd_kernel, x, args, {"STORE_RSTD": stats}, 1, stats)


plan_bwd = _norms.plan_bwd(OP, 1)


# --- the declarations -------------------------------------------------------------------


def _grads(call: Any, grads: tuple[Any, ...], saved: Any) -> tuple[Any, ...]:
    (dy,) = grads
    dx, dw = call(RMS_NORM_BWD, call.contiguous(dy), saved.x, saved.weight, saved.rstd)
    return dx, dw, None


RMS_NORM, RMS_NORM_BWD = _norms.declare_norm(
    __name__, "Tensor x, Tensor weight, float eps=1e-06 -> Tensor", "RMSNorm over the last dim",
    Backward(_grads, saves=("x", "weight", "rstd")), ("rstd",),
    bwd=("Tensor dy, Tensor x, Tensor weight, Tensor rstd -> (Tensor, Tensor)",
         "the RMSNorm backward: (dx, dweight)"),
    training_route=_torch_eager.rms_norm,
)  # fmt: skip

# The call caches the torch fronts take (y only: no backward follows) and tests reach.
_fwd_call, _y_call = RMS_NORM.call_stats, RMS_NORM.call


# --- the raw API (torch tensors, no autograd) ----------------------------------------------


def rms_norm(x: Any, weight: Any, eps: float = 1e-6) -> Any:
    """RMSNorm over the last dim of x ([..., N]); weight [N]. No autograd (see torch.ops).

    Raises GretaInputError for a wrong shape, dtype, device or layout.
    """
    return RMS_NORM.raw(x, weight, eps)


def rms_norm_fwd(x: Any, weight: Any, eps: float = 1e-6, wrap: Wrap = _identity) -> tuple[Any, Any]:
    """(y, rstd): y = x * rstd * weight over the last dim; rstd fp32 [rows].

    Raises GretaInputError for a wrong shape, dtype, device or layout.
    """
    return RMS_NORM.raw_fwd(x, weight, eps, wrap=wrap)


def rms_norm_if_eager(x: Any, weight: Any, eps: float = 1e-6) -> Any | None:
    """:func:`rms_norm` for a call :func:`~greta_core.ops._calls.eager_raw` allows (the
    torch.ops front's hot path), else None: the caller then takes its torch op."""
    done = _y_call.if_eager(x, weight, float(eps))
    return None if done is None else done[0]


def rms_norm_bwd(
    dy: Any, x: Any, weight: Any, rstd: Any, wrap: Wrap = _identity
) -> tuple[Any, Any]:
    """(dx, dweight) for dy = dL/dy; deterministic (fixed-order partial sums).

    Raises GretaInputError for a wrong shape, dtype, device or layout.
    """
    return RMS_NORM_BWD.raw(dy, x, weight, rstd, wrap=wrap)
