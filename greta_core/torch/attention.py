"""torch.ops.greta.attention (output) and attention_with_lse (output, logsumexp).

The forward runs the Triton kernel. The backward of ``greta::attention`` is the Triton
FlashAttention-2 backward (``greta::attention_bwd``, O(S) memory) for fp16/bf16 calls
without per-batch lengths; with ``q_lens``/``kv_lens`` it is the plain softmax-attention
gradient in torch ops, which materialises the [B, H, Sq, Skv] probabilities.
``greta::attention_with_lse`` is forward only.
"""

from __future__ import annotations

import math

import torch
from torch.library import triton_op, wrap_triton

from greta_core.observe import record
from greta_core.ops import attention as raw
from greta_core.ops import attention_bwd as raw_bwd
from greta_core.torch._common import record_reference, use_interpreter_on_cpu

_TRITON_DTYPES = (torch.float16, torch.bfloat16)


def _visible(
    q: torch.Tensor,
    k: torch.Tensor,
    causal: bool,
    q_lens: torch.Tensor | None,
    kv_lens: torch.Tensor | None,
) -> torch.Tensor:
    """Boolean [B, 1, Sq, Skv]: which key each query row sees (the kernel's rule)."""
    batch, _, seq_q, _ = q.shape
    seq_kv = k.shape[2]
    dev = q.device
    ql = (
        q_lens.long().clamp(max=seq_q)
        if q_lens is not None
        else torch.full((batch,), seq_q, device=dev)
    )
    kl = (
        kv_lens.long().clamp(max=seq_kv)
        if kv_lens is not None
        else torch.full((batch,), seq_kv, device=dev)
    )
    i = torch.arange(seq_q, device=dev)
    j = torch.arange(seq_kv, device=dev)
    vis = (j[None, None, :] < kl[:, None, None]) & (i[None, :, None] < ql[:, None, None])
    if causal:
        pos = (kl - ql)[:, None] + i[None, :]
        vis = vis & (j[None, None, :] <= pos[:, :, None])
    return vis[:, None]


def _probs(
    q: torch.Tensor,
    k: torch.Tensor,
    causal: bool,
    scale: float | None,
    q_lens: torch.Tensor | None,
    kv_lens: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """(P, logsumexp, k expanded to q's heads, scale), all in fp32 or wider."""
    acc = torch.promote_types(q.dtype, torch.float32)
    group = q.shape[1] // k.shape[1]
    scale = raw.default_scale(q.shape[3]) if scale is None else float(scale)
    kx = k.to(acc).repeat_interleave(group, dim=1)
    scores = (q.to(acc) @ kx.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~_visible(q, k, causal, q_lens, kv_lens), -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    # Rows that see no key (padding rows) have lse = -inf: their probabilities are 0.
    probs = torch.exp(scores - lse.unsqueeze(-1)).nan_to_num(0.0)
    return probs, lse, kx, scale


def reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
    q_lens: torch.Tensor | None = None,
    kv_lens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(o in q's dtype, logsumexp fp32 or wider): the kernel's semantics in torch ops."""
    raw.check_shapes(q, k, v, q_lens, kv_lens)
    probs, lse, _, _ = _probs(q, k, causal, scale, q_lens, kv_lens)
    group = q.shape[1] // k.shape[1]
    out = probs @ v.to(probs.dtype).repeat_interleave(group, dim=1)
    return out.to(q.dtype), lse.to(torch.promote_types(q.dtype, torch.float32))


def _reference_cpu(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scale: float | None,
    q_lens: torch.Tensor | None,
    kv_lens: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    record_reference("attention")
    out, lse = reference(q, k, v, causal, scale, q_lens, kv_lens)
    return out, lse.float()


def _forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scale: float | None,
    q_lens: torch.Tensor | None,
    kv_lens: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    if q.device.type == "cpu":
        # Traced (torch.compile / opcheck) on CPU: the reference decomposes cleanly.
        return _reference_cpu(q, k, v, causal, scale, q_lens, kv_lens)
    arch = raw.validate(q, k, v, q_lens, kv_lens)
    batch, heads, seq_q, dim = q.shape
    out = torch.empty((batch, heads, seq_q, dim), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, heads, seq_q), dtype=torch.float32, device=q.device)
    raw.launch(q, k, v, causal, scale, q_lens, kv_lens, out, lse, arch, wrap=wrap_triton)
    return out, lse


def _forward_cpu(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scale: float | None,
    q_lens: torch.Tensor | None,
    kv_lens: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    if use_interpreter_on_cpu() and q.dtype in _TRITON_DTYPES:
        return raw.attention_with_lse(q, k, v, causal, scale, q_lens, kv_lens)
    return _reference_cpu(q, k, v, causal, scale, q_lens, kv_lens)


@triton_op("greta::attention_with_lse", mutates_args=())
def attention_with_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
    q_lens: torch.Tensor | None = None,
    kv_lens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    return _forward(q, k, v, causal, scale, q_lens, kv_lens)


@attention_with_lse.register_kernel("cpu")
def _attention_with_lse_cpu(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
    q_lens: torch.Tensor | None = None,
    kv_lens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    return _forward_cpu(q, k, v, causal, scale, q_lens, kv_lens)


@triton_op("greta::attention", mutates_args=())
def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
    q_lens: torch.Tensor | None = None,
    kv_lens: torch.Tensor | None = None,
) -> torch.Tensor:
    return _forward(q, k, v, causal, scale, q_lens, kv_lens)[0]


@attention.register_kernel("cpu")
def _attention_cpu(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
    q_lens: torch.Tensor | None = None,
    kv_lens: torch.Tensor | None = None,
) -> torch.Tensor:
    return _forward_cpu(q, k, v, causal, scale, q_lens, kv_lens)[0]


def _setup_context(ctx: object, inputs: tuple, output: torch.Tensor) -> None:
    q, k, v, causal, scale, q_lens, kv_lens = inputs
    ctx.save_for_backward(q, k, v, q_lens, kv_lens)  # type: ignore[attr-defined]
    ctx.causal = causal  # type: ignore[attr-defined]
    ctx.scale = scale  # type: ignore[attr-defined]


def _reference_grads(
    grad: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scale: float | None,
    q_lens: torch.Tensor | None = None,
    kv_lens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Softmax-attention gradient in fp32 torch ops (O(S^2) memory: the probabilities)."""
    probs, _, kx, scale = _probs(q, k, causal, scale, q_lens, kv_lens)
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


@triton_op("greta::attention_bwd", mutates_args=())
def attention_bwd(
    grad: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of greta::attention without lengths, from its output and logsumexp."""
    if q.device.type == "cpu":
        return _reference_grads(grad, q, k, v, causal, scale)
    return raw_bwd.attention_bwd(grad, q, k, v, out, lse, causal, scale, wrap=wrap_triton)


@attention_bwd.register_kernel("cpu")
def _attention_bwd_cpu(
    grad: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if use_interpreter_on_cpu() and q.dtype in _TRITON_DTYPES:
        return raw_bwd.attention_bwd(grad, q, k, v, out, lse, causal, scale)
    record_reference("attention_bwd")
    return _reference_grads(grad, q, k, v, causal, scale)


def _backward(ctx: object, grad: torch.Tensor) -> tuple:
    """Triton FlashAttention-2 backward (recomputing the forward's logsumexp); with
    per-batch lengths, or dtypes the kernels do not take, the torch-ops reference."""
    q, k, v, q_lens, kv_lens = ctx.saved_tensors  # type: ignore[attr-defined]
    causal, scale = ctx.causal, ctx.scale  # type: ignore[attr-defined]
    if q_lens is None and kv_lens is None and q.dtype in _TRITON_DTYPES:
        grad = grad.contiguous()
        out, lse = torch.ops.greta.attention_with_lse(q, k, v, causal, scale)
        dq, dk, dv = torch.ops.greta.attention_bwd(grad, q, k, v, out, lse, causal, scale)
    else:
        record("attention_bwd", "reference-torch", q.device.type)
        dq, dk, dv = _reference_grads(grad, q, k, v, causal, scale, q_lens, kv_lens)
    return dq, dk, dv, None, None, None, None


attention.register_autograd(_backward, setup_context=_setup_context)
