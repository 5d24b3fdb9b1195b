"""Decoder-layer forward with the post-attention residual add fused into the MLP's norm
(``torch.ops.greta.add_rms_norm``). The layer structure is the one Llama, Mistral, Qwen2,
Qwen3 and Gemma share (pre-norm attention, pre-norm MLP, two residual adds)."""

from __future__ import annotations

import torch

from greta_core.torch._declared import ops as greta_ops
from greta_core.transformers.rms_norm import norm_eps, norm_weight


def decoder_layer_forward(
    self: torch.nn.Module,
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.LongTensor | None = None,
    use_cache: bool | None = False,
    position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
    **kwargs,
) -> torch.Tensor:
    # The KV cache travels in **kwargs under whichever name this transformers release uses
    # (`cache` since 5.2x, `past_key_values` before): naming one here would pass the other
    # release a deprecated or unknown argument.
    residual = hidden_states
    hidden_states = self.input_layernorm(hidden_states)
    hidden_states, _ = self.self_attn(
        hidden_states=hidden_states,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=use_cache,
        position_embeddings=position_embeddings,
        **kwargs,
    )
    norm = self.post_attention_layernorm
    hidden_states, residual = greta_ops.add_rms_norm(
        hidden_states, residual, norm_weight(norm), norm_eps(norm)
    )
    return residual + self.mlp(hidden_states)
