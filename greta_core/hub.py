"""GRETA's layers for Hugging Face's `kernels` library (`kernelize`, transformers' `use_kernels`).

Beside `apply_greta`, the same GRETA forwards are offered as a *local* kernel repository
(`greta_core/hub_repo`, no hub access): a layer mapping names them under the layer names
transformers marks with `use_kernel_forward_from_hub` ("RMSNorm", "rotary_pos_emb") and
two it does not mark ("GatedMLP", and "ForCausalLM": the causal-LM forward whose training
loss is the fused linear cross-entropy; `kernelize_greta` marks those classes first).

Attention and the loss use the extension points transformers has for them:
- attention is a function, not a module `kernels` can map: transformers looks it up by
  name in its `AttentionInterface`. `kernelize_greta(..., attention=True)` registers
  GRETA's as "greta" (with SDPA's mask function) and sets the model to it. transformers'
  other route, a hub kernel named as `attn_implementation="<repo id>:<function>"`, needs a
  `kernels` in transformers' own range (0.18.2 <= v < 0.19 for transformers 5.24; below it,
  an ImportError) and registers flash-attention's 2-D padding mask for the function, which
  GRETA's causal kernel does not take: not offered.
- the loss: transformers' loss mapping (`LOSS_MAPPING`, `model.loss_function`) receives the
  logits, so a fused loss that never builds them cannot go there; it replaces the
  `*ForCausalLM` forward instead, as the "ForCausalLM" layer.

    from kernels import Mode
    from greta_core.hub import kernelize_greta

    model = kernelize_greta(model, mode=Mode.INFERENCE)  # or Mode.TRAINING

or with the `kernels` API directly:

    from kernels import Mode, kernelize, use_kernel_mapping
    from greta_core.hub import layer_mapping

    with use_kernel_mapping(layer_mapping()):
        kernelize(model, mode=Mode.INFERENCE, device="cpu")

The layers follow `kernels`' rules: stateless (no constructor, no members), the forward of
the layer they replace, run on the module's own weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

import greta_core.torch  # noqa: F401  (registers torch.ops.greta.*)
from greta_core.errors import GretaInputError
from greta_core.transformers.causal_lm import causal_lm_forward
from greta_core.transformers.mlp import glu_mlp_forward
from greta_core.transformers.rms_norm import rms_norm_forward
from greta_core.transformers.rope import make_apply_rotary_pos_emb

# The local repository: one build variant per device type `kernels` knows GRETA runs on;
# each variant's module exposes this file's layers as `layers`.
REPOSITORY = Path(__file__).resolve().parent / "hub_repo"
DEVICES = ("cpu", "cuda", "rocm")
LAYER_NAMES = ("RMSNorm", "GatedMLP", "rotary_pos_emb", "ForCausalLM")


class RMSNorm(torch.nn.Module):
    """`torch.ops.greta.rms_norm` over the norm's own weight and eps (Gemma's offset too)."""

    can_torch_compile = True
    has_backward = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return rms_norm_forward(self, hidden_states)


class GatedMLP(torch.nn.Module):
    """down(act(gate(x)) * up(x)) with the gating fused (`swiglu` / `geglu`)."""

    can_torch_compile = True
    has_backward = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return glu_mlp_forward(self, x)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _reference_rope(q, k, cos, sin, unsqueeze_dim=1):  # type: ignore[no-untyped-def]
    """transformers' apply_rotary_pos_emb, for the layouts GRETA's rope does not take."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


_apply_rope = make_apply_rotary_pos_emb(_reference_rope)


class rotary_pos_emb(torch.nn.Module):  # lower case: the layer name transformers looks up
    """apply_rotary_pos_emb through `torch.ops.greta.rope` (views, no copies)."""

    can_torch_compile = True
    has_backward = True

    def forward(self, q, k, cos, sin, unsqueeze_dim=1):  # type: ignore[no-untyped-def]
        return _apply_rope(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)


class ForCausalLM(torch.nn.Module):
    """`*ForCausalLM.forward` with the fused linear cross-entropy as its training loss (no
    logits in training, as `apply_greta(cross_entropy=True)`); logits as usual otherwise.
    The signature is transformers' (its fourth argument is the KV cache, named `cache`
    from 5.2x on), which `kernels` checks."""

    can_torch_compile = True
    has_backward = True

    def forward(  # type: ignore[no-untyped-def]
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        cache=None,
        inputs_embeds=None,
        labels=None,
        use_cache=None,
        logits_to_keep=0,
        **kwargs,
    ):
        if cache is not None:
            kwargs[_cache_argument(type(self.model))] = cache
        return causal_lm_forward(
            self, input_ids, attention_mask, position_ids, inputs_embeds, labels, use_cache,
            logits_to_keep, **kwargs,
        )  # fmt: skip


def _cache_argument(base_model: type) -> str:
    """The base model's name for the KV cache: `cache` (transformers 5.2x) or the older one."""
    import inspect

    params = inspect.signature(base_model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def layer_mapping(repository: Path = REPOSITORY) -> dict[str, dict[str, Any]]:
    """{layer name: {device: LocalLayerRepository}} for `kernels.use_kernel_mapping`."""
    from kernels import LocalLayerRepository

    return {
        name: {
            device: LocalLayerRepository(repo_path=repository, layer_name=name)
            for device in DEVICES
        }
        for name in LAYER_NAMES
    }


def mark_layers(model: torch.nn.Module) -> None:
    """Make the model family's norm and gated-MLP classes kernelizable as "RMSNorm" and
    "GatedMLP" where transformers has not marked them (it marks norms and RoPE only when
    the installed `kernels` is in its supported range, and never MLPs). Gemma's norms scale
    by (1 + weight): their instances are told so, as apply_greta does."""
    from kernels import replace_kernel_forward_from_hub

    from greta_core.transformers._families import FAMILIES

    model_type = getattr(getattr(model, "config", None), "model_type", None)
    family = FAMILIES.get(str(model_type))
    if family is None:
        raise GretaInputError(
            f"kernelize_greta: model type {model_type!r} is not one GRETA's layers were "
            f"checked against ({', '.join(FAMILIES)})"
        )
    for suffix, name in (
        ("RMSNorm", "RMSNorm"),
        ("MLP", "GatedMLP"),
        ("ForCausalLM", "ForCausalLM"),
    ):
        cls = family.cls(suffix)
        if cls is not None and getattr(cls, "kernel_layer_name", None) is None:
            replace_kernel_forward_from_hub(cls, name)
    norm_cls = family.cls("RMSNorm")
    if family.norm_weight_offset and norm_cls is not None:
        for module in model.modules():
            if isinstance(module, norm_cls):
                module._greta_weight_offset = True


def kernelize_greta(
    model: torch.nn.Module, *, mode: Any, device: str | None = None, attention: bool = True
) -> torch.nn.Module:
    """`kernels.kernelize` with GRETA's local layer mapping (no hub access); with
    `attention`, GRETA's attention through transformers' `AttentionInterface` too."""
    from kernels import kernelize, use_kernel_mapping

    mark_layers(model)
    with use_kernel_mapping(layer_mapping(), inherit_mapping=False):
        model = kernelize(model, mode=mode, device=device)
    if attention:
        from greta_core.transformers import attention as attn

        attn.register()
        model.set_attn_implementation(attn.NAME)
    return model
