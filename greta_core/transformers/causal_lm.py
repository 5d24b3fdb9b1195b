"""``*ForCausalLM.forward`` whose training loss never materialises the logits.

With labels in training mode the loss is ``torch.ops.greta.linear_cross_entropy`` (through
its Python entry, ``greta_core.torch._declared.ops``) of the last hidden states and the LM
head's weight (chunked over tokens: the [tokens, vocab] logits never exist) and ``logits``
is None, as in Liger-Kernel. Otherwise (eval,
``generate``, or ``skip_logits=False``) the logits are computed as usual, and a loss too
when labels are given. Shifting and ``num_items_in_batch`` follow transformers'
``ForCausalLMLoss``. Unless the hidden states are returned (``output_hidden_states``), the
fused loss writes its hidden gradient over the final hidden states (``consume_inputs``).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from greta_core.torch._common import consume_inputs
from greta_core.torch._declared import ops as greta_ops

IGNORE_INDEX = -100


def causal_lm_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor | None,
    shift_labels: torch.Tensor | None = None,
    num_items_in_batch: torch.Tensor | int | None = None,
    ignore_index: int = IGNORE_INDEX,
) -> torch.Tensor:
    """Next-token cross-entropy of ``hidden @ weight.T`` against `labels` shifted by one."""
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    h = hidden.reshape(-1, hidden.shape[-1])
    target = shift_labels.reshape(-1).to(device=h.device, dtype=torch.long)
    if num_items_in_batch is None:
        return greta_ops.linear_cross_entropy(h, weight, target, ignore_index, "mean")
    total = greta_ops.linear_cross_entropy(h, weight, target, ignore_index, "sum")
    if isinstance(num_items_in_batch, torch.Tensor):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


def _owns_final_hidden(outputs) -> bool:
    """The final hidden states are this forward's own, read by nothing after the loss, unless
    they go back to the caller (output_hidden_states). The loss may then write its hidden
    gradient over them (one [tokens, hidden] tensor less at the forward's peak). Not while
    compiling: dynamo would trace the context variable."""
    return outputs.hidden_states is None and not torch.compiler.is_compiling()


def causal_lm_forward(
    self: torch.nn.Module,
    input_ids: torch.LongTensor | None = None,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.LongTensor | None = None,
    inputs_embeds: torch.Tensor | None = None,
    labels: torch.LongTensor | None = None,
    use_cache: bool | None = None,
    logits_to_keep: int | torch.Tensor = 0,
    skip_logits: bool | None = None,
    **kwargs,
):
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return_dict = kwargs.pop("return_dict", None)
    shift_labels = kwargs.pop("shift_labels", None)
    outputs = self.model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        inputs_embeds=inputs_embeds,
        use_cache=use_cache,
        **kwargs,
    )
    hidden = outputs.last_hidden_state
    keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
    hidden = hidden[:, keep, :]
    has_labels = labels is not None or shift_labels is not None
    if skip_logits is None:
        skip_logits = self.training and has_labels
    fused = skip_logits and has_labels and getattr(self.lm_head, "bias", None) is None
    loss = logits = None
    if fused:
        with consume_inputs() if _owns_final_hidden(outputs) else contextlib.nullcontext():
            loss = causal_lm_loss(
                hidden, self.lm_head.weight, labels, shift_labels, kwargs.get("num_items_in_batch")
            )
    else:
        logits = self.lm_head(hidden)
        if has_labels:
            loss = self.loss_function(
                logits=logits, labels=labels, shift_labels=shift_labels,
                vocab_size=self.config.vocab_size, **kwargs,
            )  # fmt: skip
    # The KV-cache field: `cache` from transformers 5.2x on, `past_key_values` before; asked
    # of the dataclass so no deprecated name is ever set (a dict lookup: traceable).
    cache = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
    out = CausalLMOutputWithPast(
        loss=loss,
        logits=logits,
        hidden_states=outputs.hidden_states,
        attentions=outputs.attentions,
        **{cache: getattr(outputs, cache)},
    )
    return out if return_dict is not False else out.to_tuple()
