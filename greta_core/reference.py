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


# --- vec_add ------------------------------------------------------------------------------


def vec_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y


# --- rope ---------------------------------------------------------------------------------


def rope(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool = False
) -> torch.Tensor:
    """Rotate-half RoPE of x [batch, seq, heads, d] by cos/sin [seq, d/2] or [batch|1, seq, d/2]."""
    ct = compute_dtype(x)
    c = cos.to(ct).unsqueeze(-2)
    s = sin.to(ct).unsqueeze(-2)
    if c.dim() == 3:
        c, s = c.unsqueeze(0), s.unsqueeze(0)
    if inverse:
        s = -s
    half = x.shape[-1] // 2
    xf = x.to(ct)
    x1, x2 = xf[..., :half], xf[..., half:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)


def rope_angles(
    positions: torch.Tensor, theta: float, head_dim: int, dtype: torch.dtype
) -> torch.Tensor:
    """pos * theta^(-2i/head_dim): [..., head_dim/2]."""
    i = torch.arange(head_dim // 2, device=positions.device, dtype=dtype)
    inv_freq = theta ** (-(2.0 * i) / head_dim)
    return positions.to(dtype)[..., None] * inv_freq


def rope_positions(
    x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0, inverse: bool = False
) -> torch.Tensor:
    """RoPE with the angles of integer positions [seq] or [batch|1, seq]."""
    ang = rope_angles(positions, theta, x.shape[-1], compute_dtype(x))
    return rope(x, ang.cos(), ang.sin(), inverse)


# --- kv_cache_append ----------------------------------------------------------------------


def kv_cache_append(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    cache_lens: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """Write k/v [B, H, T, D] into the caches [B, H, S, D] at cache_lens[b] + t, in place;
    returns the new lengths. The caller checks capacity (scatter_ raises past S)."""
    batch, heads, new_tokens, head_dim = k.shape
    pos = cache_lens.long()[:, None] + torch.arange(new_tokens, device=k.device)
    index = pos[:, None, :, None].expand(batch, heads, new_tokens, head_dim)
    # scatter_, not a Python loop over lengths: traceable under torch.compile.
    k_cache.scatter_(2, index, k)
    v_cache.scatter_(2, index, v)
    return cache_lens + new_tokens


# --- matmul -------------------------------------------------------------------------------


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """GEMM accumulation: fp32, or wider when the inputs are."""
    return torch.promote_types(dtype, torch.float32)


def matmul(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """a @ b (+ bias): fp32 (or wider) accumulation, result in the input dtype."""
    acc = acc_dtype(a.dtype)
    out = a.to(acc) @ b.to(acc)
    if bias is not None:
        out = out + bias.to(acc)
    return out.to(a.dtype)


# --- attention ----------------------------------------------------------------------------


def attention_visible(
    q: torch.Tensor, k: torch.Tensor, causal: bool,
    q_lens: torch.Tensor | None = None, kv_lens: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """Boolean [B, 1, Sq, Skv]: which key each query row sees. Query row i < q_len sits at
    position kv_len - q_len + i (bottom-right causal); lengths clamp to [0, S]."""
    batch, _, seq_q, _ = q.shape
    seq_kv = k.shape[2]
    dev = q.device
    full_q = torch.full((batch,), seq_q, device=dev)
    full_kv = torch.full((batch,), seq_kv, device=dev)
    ql = q_lens.long().clamp(0, seq_q) if q_lens is not None else full_q
    kl = kv_lens.long().clamp(0, seq_kv) if kv_lens is not None else full_kv
    i = torch.arange(seq_q, device=dev)
    j = torch.arange(seq_kv, device=dev)
    vis = (j[None, None, :] < kl[:, None, None]) & (i[None, :, None] < ql[:, None, None])
    if causal:
        pos = (kl - ql)[:, None] + i[None, :]
        vis = vis & (j[None, None, :] <= pos[:, :, None])
    return vis[:, None]


def attention_probs(
    q: torch.Tensor, k: torch.Tensor, causal: bool, scale: float | None,
    q_lens: torch.Tensor | None = None, kv_lens: torch.Tensor | None = None,
) -> tuple[Any, Any, Any, float]:  # fmt: skip
    """(P, logsumexp, k repeated to q's heads, scale), all in fp32 or wider."""
    acc = torch.promote_types(q.dtype, torch.float32)
    group = q.shape[1] // k.shape[1]
    scale = 1.0 / math.sqrt(q.shape[3]) if scale is None else float(scale)
    kx = k.to(acc).repeat_interleave(group, dim=1)
    scores = (q.to(acc) @ kx.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~attention_visible(q, k, causal, q_lens, kv_lens), -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    # A row that sees no key has lse = -inf: its probabilities are 0. Only those rows: a NaN
    # (or inf) from the inputs propagates, as in SDPA.
    no_key = torch.isneginf(lse).unsqueeze(-1)
    probs = torch.where(no_key, 0.0, torch.exp(scores - lse.unsqueeze(-1)))
    return probs, lse, kx, scale


def attention_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
    scale: float | None = None, q_lens: torch.Tensor | None = None,
    kv_lens: torch.Tensor | None = None,
) -> tuple[Any, Any]:  # fmt: skip
    """(o in q's dtype, logsumexp fp32 or wider) of softmax(q k^T * scale) v, GQA."""
    probs, lse, _, _ = attention_probs(q, k, causal, scale, q_lens, kv_lens)
    group = q.shape[1] // k.shape[1]
    vx = v.to(probs.dtype).repeat_interleave(group, dim=1)
    if causal or q_lens is not None or kv_lens is not None:
        # A NaN value reaches only the rows that see its key, not the others through 0 * NaN.
        # (Without a mask every row sees every key: the plain product is already right.)
        v_nan = vx.isnan()
        seen = attention_visible(q, k, causal, q_lens, kv_lens).to(probs.dtype)
        hits = (seen @ v_nan.to(probs.dtype)) > 0
        out = torch.where(hits, math.nan, probs @ vx.masked_fill(v_nan, 0.0))
    else:
        out = probs @ vx
    return out.to(q.dtype), lse.to(torch.promote_types(q.dtype, torch.float32))


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
    scale: float | None = None, q_lens: torch.Tensor | None = None,
    kv_lens: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    return attention_with_lse(q, k, v, causal, scale, q_lens, kv_lens)[0]


def attention_bwd(
    grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
    scale: float | None, q_lens: torch.Tensor | None = None,
    kv_lens: torch.Tensor | None = None,
) -> tuple[Any, Any, Any]:  # fmt: skip
    """(dq, dk, dv): the softmax-attention gradient (O(S^2) memory: the probabilities)."""
    probs, _, kx, scale = attention_probs(q, k, causal, scale, q_lens, kv_lens)
    acc = probs.dtype
    batch, heads_kv, seq_kv, dim = k.shape
    group = q.shape[1] // heads_kv
    vx = v.to(acc).repeat_interleave(group, dim=1)
    d_out = grad.to(acc)
    d_v = probs.transpose(-1, -2) @ d_out
    d_p = d_out @ vx.transpose(-1, -2)
    d_s = probs * (d_p - (d_p * probs).sum(-1, keepdim=True))
    d_q = (d_s @ kx) * scale
    d_k = (d_s.transpose(-1, -2) @ q.to(acc)) * scale

    def fold(t: torch.Tensor) -> torch.Tensor:  # sum the query heads sharing a kv head
        return t.reshape(batch, heads_kv, group, seq_kv, dim).sum(2)

    return d_q.to(q.dtype), fold(d_k).to(k.dtype), fold(d_v).to(v.dtype)


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
