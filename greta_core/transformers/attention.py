"""Attention through transformers' ``AttentionInterface``: ``torch.ops.greta.attention``.

Registered as the "greta" implementation (``model.set_attn_implementation("greta")``),
with SDPA's mask function: a causal call without padding gets no mask at all (GRETA's
causal kernel, bottom-right aligned for a KV cache, is then exact), and any real mask
(padding, packed sequences, a custom mask) falls back to torch SDPA, said once with a
warning and recorded in ``greta_core.observe`` as ``attention -> torch-sdpa``.
"""

from __future__ import annotations

import torch

from greta_core.torch._declared import ops as greta_ops
from greta_core.transformers._fallback import fall_back

NAME = "greta"
# The same kernel in training too, whatever the arch's table prefers there.
NAME_ALWAYS = "greta_always"
# What the Triton kernel takes on a GPU; on CPU the op runs its torch reference (any float).
GPU_DTYPES = (torch.float16, torch.bfloat16)
GPU_HEAD_DIMS = (64, 128)


def _unsupported(module, query, key, attention_mask, dropout, sliding_window, softcap) -> str:
    if attention_mask is not None:
        return "an attention mask (padding or packed sequences) is not expressible as GRETA's causal kernel"
    if dropout and module.training:
        return "attention dropout"
    if softcap is not None:
        return "logit softcapping"
    if sliding_window is not None and key.shape[2] > sliding_window:
        return "a sliding window shorter than the keys"
    if 1 < query.shape[2] != key.shape[2]:
        # Without a mask SDPA aligns is_causal top-left here (a static cache's prefill);
        # GRETA's causal kernel aligns bottom-right (a growing cache).
        return "a maskless call with more keys than queries (static-cache prefill)"
    if query.device.type != "cpu":
        if query.dtype not in GPU_DTYPES:
            return f"dtype {query.dtype} (the Triton kernel takes float16/bfloat16)"
        if query.shape[-1] not in GPU_HEAD_DIMS:
            return f"head_dim {query.shape[-1]} (the Triton kernel takes 64 or 128)"
    return ""


def _sdpa_trains_faster(query: torch.Tensor) -> bool:
    """Training on a GPU whose config table sends attention's backward to SDPA."""
    if query.device.type == "cpu" or not (torch.is_grad_enabled() and query.requires_grad):
        return False
    from greta_core import configs
    from greta_core.arch import arch_of

    return configs.lookup("attention_training", arch_of(query)).get("backend") == "sdpa"


def _attention_forward(by_table: bool):
    """transformers' attention-function signature around GRETA's kernel; `by_table`: let the
    arch's ``attention_training`` table send training calls to SDPA."""

    def forward(
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        dropout: float = 0.0,
        scaling: float | None = None,
        is_causal: bool | None = None,
        sliding_window: int | None = None,
        softcap: float | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, None]:
        reason = _unsupported(module, query, key, attention_mask, dropout, sliding_window, softcap)
        if not reason and by_table and _sdpa_trains_faster(query):
            reason = (
                "training: SDPA's backward is faster on this GPU (configs 'attention_training')"
            )
        if reason:
            from transformers.integrations.sdpa_attention import sdpa_attention_forward

            fall_back("attention", "torch-sdpa", reason)
            return sdpa_attention_forward(
                module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                is_causal=is_causal, **kwargs,
            )  # fmt: skip
        causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
        # One query (a decode step) sees every key: no causal masking to do.
        causal = bool(causal) and query.shape[2] > 1
        out = greta_ops.attention(query, key, value, causal, scaling)
        return out.transpose(1, 2).contiguous(), None

    return forward


greta_attention_forward = _attention_forward(by_table=True)
greta_attention_forward.__name__ = greta_attention_forward.__qualname__ = "greta_attention_forward"
greta_attention_forward.__doc__ = """q [B, H, Sq, D], k/v [B, Hkv, Skv, D] -> ([B, Sq, H, D], None),
as transformers wants. In training, the arch's ``attention_training`` table entry may send
the call to SDPA (its backward is faster there)."""

greta_attention_forward_always = _attention_forward(by_table=False)
greta_attention_forward_always.__name__ = "greta_attention_forward_always"
greta_attention_forward_always.__qualname__ = "greta_attention_forward_always"
greta_attention_forward_always.__doc__ = """:func:`greta_attention_forward` with GRETA's kernel
in training too (``apply_greta(..., attention="always")``)."""


def register() -> None:
    """Make "greta" a valid ``attn_implementation`` (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    for name, forward in ((NAME, greta_attention_forward),
                          (NAME_ALWAYS, greta_attention_forward_always)):  # fmt: skip
        AttentionInterface.register(name, forward)
        AttentionMaskInterface.register(name, sdpa_mask)
