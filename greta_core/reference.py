"""The torch reference maths of every GRETA op: one definition per op.

Used by the CPU kernels of ``torch.ops.greta`` (``greta_core.torch``), GretaCompute's
``reference`` implementation and the bench's correctness checks. Plain torch, no
validation (the callers validate), fp32 compute for every dtype but float64.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    """float64 stays float64 (gradcheck); everything else computes in float32."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


# --- rms_norm -----------------------------------------------------------------------------


def rms_norm_fwd(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[Any, Any]:
    """(y, rstd): y = x * rstd * weight over the last dim; rstd [rows] in the compute dtype."""
    ct = compute_dtype(x)
    xf = _rows(x).to(ct)
    rstd = torch.rsqrt(xf.pow(2).mean(-1) + eps)
    y = (xf * rstd[:, None] * weight.to(ct)).to(x.dtype).reshape(x.shape)
    return y, rstd


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return rms_norm_fwd(x, weight, eps)[0]


def rms_norm_bwd(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor
) -> tuple[Any, Any]:
    """(dx, dweight): dx = rstd * (g - xhat * mean(g * xhat)), g = weight * dy."""
    ct = compute_dtype(x)
    xhat = _rows(x).to(ct) * rstd.to(ct)[:, None]
    dyf = _rows(dy).to(ct)
    g = dyf * weight.to(ct)
    c = (g * xhat).mean(-1, keepdim=True)
    dx = ((g - xhat * c) * rstd.to(ct)[:, None]).to(x.dtype).reshape(x.shape)
    dw = (dyf * xhat).sum(0).to(weight.dtype)
    return dx, dw


# --- layer_norm ---------------------------------------------------------------------------


def layer_norm_fwd(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float
) -> tuple[Any, Any, Any]:
    """(y, mean, rstd): y = (x - mean) * rstd * weight + bias; mean/rstd [rows]."""
    ct = compute_dtype(x)
    xf = _rows(x).to(ct)
    mean = xf.mean(-1)
    xc = xf - mean[:, None]
    rstd = torch.rsqrt(xc.pow(2).mean(-1) + eps)
    y = xc * rstd[:, None] * weight.to(ct)
    if bias is not None:
        y = y + bias.to(ct)
    return y.to(x.dtype).reshape(x.shape), mean, rstd


def layer_norm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, eps: float = 1e-5
) -> torch.Tensor:
    return layer_norm_fwd(x, weight, bias, eps)[0]


def layer_norm_bwd(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor
) -> tuple[Any, Any, Any]:
    """(dx, dweight, dbias); dbias in the weight's dtype."""
    ct = compute_dtype(x)
    r = rstd.to(ct)[:, None]
    xhat = (_rows(x).to(ct) - mean.to(ct)[:, None]) * r
    dyf = _rows(dy).to(ct)
    g = dyf * weight.to(ct)
    c1 = (g * xhat).mean(-1, keepdim=True)
    c2 = g.mean(-1, keepdim=True)
    dx = ((g - xhat * c1 - c2) * r).to(x.dtype).reshape(x.shape)
    return dx, (dyf * xhat).sum(0).to(weight.dtype), dyf.sum(0).to(weight.dtype)


# --- softmax ------------------------------------------------------------------------------


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim."""
    return torch.softmax(x.to(compute_dtype(x)), dim=-1).to(x.dtype)


def softmax_bwd(dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """dx = y * (dy - sum(y * dy, -1))."""
    ct = compute_dtype(y)
    yf, dyf = y.to(ct), dy.to(ct)
    return (yf * (dyf - (yf * dyf).sum(-1, keepdim=True))).to(y.dtype)


# --- add_rms_norm -------------------------------------------------------------------------


def add_rms_norm_fwd(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[Any, Any, Any]:
    """(y, s, rstd): s = x + residual (in x's dtype), y = rms_norm(s) of s as stored."""
    s = (x.to(compute_dtype(x)) + residual.to(compute_dtype(x))).to(x.dtype)
    y, rstd = rms_norm_fwd(s, weight, eps)
    return y, s, rstd


def add_rms_norm_bwd(
    dy: torch.Tensor, ds: torch.Tensor, s: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor
) -> tuple[Any, Any]:
    """(dx, dweight): dx = rms_norm_bwd(dy) + ds, also the residual's gradient."""
    dx, dw = rms_norm_bwd(dy, s, weight, rstd)
    ct = compute_dtype(s)
    return (dx.to(ct) + ds.to(ct)).to(s.dtype), dw


# --- swiglu / geglu -----------------------------------------------------------------------

GLU_ACTIVATIONS = ("silu", "gelu_tanh")


def _act_and_grad(g: torch.Tensor, activation: str) -> tuple[torch.Tensor, torch.Tensor]:
    if activation == "silu":
        sig = torch.sigmoid(g)
        return g * sig, sig * (1 + g * (1 - sig))
    k = math.sqrt(2 / math.pi)
    t = torch.tanh(k * (g + 0.044715 * g**3))
    return 0.5 * g * (1 + t), 0.5 * (1 + t) + 0.5 * g * (1 - t * t) * k * (1 + 3 * 0.044715 * g * g)


def glu(gate: torch.Tensor, up: torch.Tensor, activation: str) -> torch.Tensor:
    """act(gate) * up: activation "silu" (SwiGLU) or "gelu_tanh" (GeGLU)."""
    ct = compute_dtype(gate)
    act, _ = _act_and_grad(gate.to(ct), activation)
    return (act * up.to(ct)).to(gate.dtype)


def glu_bwd(
    dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, activation: str
) -> tuple[Any, Any]:
    """(dgate, dup) of act(gate) * up."""
    ct = compute_dtype(gate)
    act, dact = _act_and_grad(gate.to(ct), activation)
    dyf = dy.to(ct)
    return (dyf * up.to(ct) * dact).to(gate.dtype), (dyf * act).to(up.dtype)


# --- linear_cross_entropy -----------------------------------------------------------------


def cross_entropy_rows(
    logits: torch.Tensor, target: torch.Tensor, ignore_index: int
) -> tuple[Any, Any]:
    """(loss per row, softmax - onehot per row), fp32 or wider; ignored rows give zeros."""
    lf = logits.to(torch.promote_types(logits.dtype, torch.float32))
    valid = target != ignore_index
    safe = torch.where(valid, target, 0)
    lse = torch.logsumexp(lf, dim=-1)
    loss = torch.where(valid, lse - lf.gather(1, safe[:, None])[:, 0], 0.0)
    grad = torch.softmax(lf, dim=-1)
    grad[torch.arange(len(safe), device=grad.device), safe] -= 1.0
    return loss, grad * valid[:, None]


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> torch.Tensor:
    """Cross-entropy of ``hidden @ weight.T`` (full logits: the reference, not the fused op)."""
    logits = hidden @ weight.t()
    loss, _ = cross_entropy_rows(logits, target, ignore_index)
    if reduction == "none":
        return loss
    total = loss.sum()
    if reduction == "sum":
        return total
    return total / (target != ignore_index).sum().clamp(min=1)


def linear_cross_entropy_bwd(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    row_scale: torch.Tensor,
    ignore_index: int = -100,
) -> tuple[Any, Any]:
    """(dhidden, dweight) for d loss_i = row_scale_i (per-row upstream gradient)."""
    logits = hidden @ weight.t()
    _, grad = cross_entropy_rows(logits, target, ignore_index)
    dlogits = grad * row_scale.to(grad.dtype)[:, None]
    ct = dlogits.dtype
    dh = (dlogits @ weight.to(ct)).to(hidden.dtype)
    dw = (dlogits.t() @ hidden.to(ct)).to(weight.dtype)
    return dh, dw
