"""LayerNorm over the last dim: the declarations of greta::layer_norm (its forward
greta::layer_norm_fwd also returns the fp32 mean and rstd per row the backward reads) and of
its backward's kernel op greta::layer_norm_bwd."""

from __future__ import annotations

from typing import Any

from greta_core.ops import _interp_compat, _norms, _torch_eager
from greta_core.ops._plan import In, Out, Plan, Wrap, _identity
from greta_core.ops._rows import row_kernel_plan, rows_stride
from greta_core.ops.declare import Backward, Meta

OP = "layer_norm"
_interp_compat.apply()


def validate(
    x: Any, weight: Any, bias: Any | None = None, eps: float = 1e-5, reference: bool = False
) -> str:
    """Check the inputs; returns the arch to launch on. Raises GretaInputError."""
    return _norms.validate_fwd(OP, x, weight, bias, reference)


def validate_bwd(
    dy: Any, x: Any, weight: Any, mean: Any, rstd: Any, reference: bool = False
) -> str:
    """Check the backward's inputs; returns the arch to launch on. Raises GretaInputError."""
    return _norms.validate_bwd(OP, dy, x, weight, reference, mean=mean, rstd=rstd)


def check_arrays(x: Any, weight: Any, bias: Any | None, eps: float) -> None:
    _norms.check_arrays(OP, x, weight, bias)


# --- launch plans: (x [..., N], weight, bias or None) and (dy, x, weight, mean, rstd) -----


def plan_fwd(arch: str, x: Meta, weight: Meta, bias: Meta | None, eps: float, stats: bool) -> Plan:
    """Buffers: y (x's shape and dtype), with `stats` mean and rstd fp32 [rows]. Without a
    bias the kernel gets the weight in its place (never read: HAS_BIAS is False)."""
    from greta_core.kernels.layer_norm import layer_norm_fwd_kernel

    has_bias = bias is not None
    mean, rstd = (Out(1), Out(2)) if stats else (Out(0), Out(0))
    args = (In(0), In(1), In(2 if has_bias else 1), x.shape[-1], rows_stride(x), eps, Out(0),
            mean, rstd)  # fmt: skip
    flags = {"HAS_BIAS": has_bias, "STORE_STATS": stats}
    return row_kernel_plan(OP, arch, layer_norm_fwd_kernel, x, args, flags, 1, 2 * stats)


plan_bwd = _norms.plan_bwd(OP, 2)


# --- the declarations -------------------------------------------------------------------


def _grads(call: Any, grads: tuple[Any, ...], saved: Any) -> tuple[Any, ...]:
    (dy,) = grads
    dx, dw, db = call(
        LAYER_NORM_BWD, call.contiguous(dy), saved.x, saved.weight, saved.mean, saved.rstd
    )
    return dx, dw, (None if saved.bias is None else db), None


LAYER_NORM, LAYER_NORM_BWD = _norms.declare_norm(
    __name__, "Tensor x, Tensor weight, Tensor? bias=None, float eps=1e-05 -> Tensor",
    "LayerNorm over the last dim",
    Backward(_grads, saves=("x", "weight", "bias", "mean", "rstd")), ("mean", "rstd"),
    bwd=("Tensor dy, Tensor x, Tensor weight, Tensor mean, Tensor rstd -> (Tensor, Tensor, Tensor)",
         "the LayerNorm backward: (dx, dweight, dbias)"),
    training_route=_torch_eager.layer_norm,
)  # fmt: skip

# The call caches the torch fronts take (y only: no backward follows) and tests reach.
_fwd_call, _y_call = LAYER_NORM.call_stats, LAYER_NORM.call


# --- the raw API (torch tensors, no autograd) ----------------------------------------------


def layer_norm(x: Any, weight: Any, bias: Any | None = None, eps: float = 1e-5) -> Any:
    """LayerNorm over the last dim of x ([..., N]); weight/bias [N]. No autograd.

    Raises GretaInputError for a wrong shape, dtype, device or layout.
    """
    return LAYER_NORM.raw(x, weight, bias, eps)


def layer_norm_fwd(
    x: Any, weight: Any, bias: Any | None = None, eps: float = 1e-5, wrap: Wrap = _identity
) -> tuple[Any, Any, Any]:
    """(y, mean, rstd): y = (x - mean) * rstd * weight + bias; mean/rstd fp32 [rows].

    Raises GretaInputError for a wrong shape, dtype, device or layout.
    """
    return LAYER_NORM.raw_fwd(x, weight, bias, eps, wrap=wrap)


def layer_norm_if_eager(
    x: Any, weight: Any, bias: Any | None = None, eps: float = 1e-5
) -> Any | None:
    """:func:`layer_norm` for a call :func:`~greta_core.ops._calls.eager_raw` allows (the
    torch.ops front's hot path), else None: the caller then takes its torch op."""
    done = _y_call.if_eager(x, weight, bias, float(eps))
    return None if done is None else done[0]


def layer_norm_bwd(
    dy: Any, x: Any, weight: Any, mean: Any, rstd: Any, wrap: Wrap = _identity
) -> tuple[Any, Any, Any]:
    """(dx, dweight, dbias); deterministic (fixed-order partial sums). dbias in weight dtype.

    Raises GretaInputError for a wrong shape, dtype, device or layout.
    """
    return LAYER_NORM_BWD.raw(dy, x, weight, mean, rstd, wrap=wrap)
