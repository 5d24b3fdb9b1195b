"""apply_greta: patch GRETA's kernels into a Hugging Face model, or into a family's classes.

Instance mode (``apply_greta(model)``) replaces the forwards of that model's modules and
switches its attention to the registered "greta" implementation. Class mode
(``apply_greta("llama")``) patches the family's classes, so models built afterwards use
GRETA, with attention through a family-local ``AttentionInterface`` that maps "sdpa" (the
default) to GRETA. RoPE is a module-level function in transformers: either mode patches it
for the whole family, and ``revert_greta(family)`` restores it. ``revert_greta`` undoes either
mode.
"""

from __future__ import annotations

import types
import weakref
from dataclasses import dataclass
from typing import Any, Literal

import torch

from greta_core.errors import GretaInputError
from greta_core.transformers import attention as attn
from greta_core.transformers._families import FAMILIES, Family
from greta_core.transformers.causal_lm import causal_lm_forward
from greta_core.transformers.decoder import decoder_layer_forward
from greta_core.transformers.mlp import glu_mlp_forward
from greta_core.transformers.rms_norm import rms_norm_forward
from greta_core.transformers.rope import make_apply_rotary_pos_emb

KERNELS = ("rms_norm", "rope", "attention", "swiglu", "add_rms_norm", "cross_entropy")
_MISSING = object()
_ATTN = "_greta_attn_implementation"  # a log entry restoring the model's attention choice
# (object, attribute, previous value) per patched family / model, for revert_greta. Models
# are weak keys: patching must not keep a discarded model alive.
_saved_families: dict[str, list[tuple[Any, str, Any]]] = {}
_saved_models: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _log(key: Any) -> list[tuple[Any, str, Any]]:
    saved = _saved_families if isinstance(key, str) else _saved_models
    return saved.setdefault(key, [])


def patched_targets() -> list[Any]:
    """Every family name and model apply_greta has patched and revert_greta not undone."""
    return [*_saved_families, *_saved_models]


@dataclass(frozen=True)
class Patched:
    family: str
    mode: str  # "model" or "classes"
    kernels: tuple[str, ...]  # the kernels patched in


def _family_of(target: torch.nn.Module | str) -> Family:
    name = target if isinstance(target, str) else getattr(target.config, "model_type", "")
    family = FAMILIES.get(str(name).lower())
    if family is None:
        raise GretaInputError(
            f"apply_greta: model type {name!r} is not supported; supported: {', '.join(FAMILIES)}"
        )
    return family


def _set(key: Any, obj: Any, attr: str, value: Any) -> None:
    log = _log(key)
    # The model itself is logged as None: a weak key must not be referenced by its value.
    entry = None if obj is key else obj
    if not any(o is entry and a == attr for o, a, _ in log):
        log.append((entry, attr, obj.__dict__.get(attr, _MISSING)))
    setattr(obj, attr, value)


def _patch_rope(key: Any, family: Family) -> None:
    module = family.module()
    current = module.apply_rotary_pos_emb
    original = getattr(current, "__greta_original__", current)
    _set(key, module, "apply_rotary_pos_emb", make_apply_rotary_pos_emb(original))


def _check_transformers() -> None:
    import transformers
    from packaging.version import Version

    if Version(transformers.__version__).major < 5:
        raise GretaInputError(
            f"apply_greta needs transformers >= 5.0 (found {transformers.__version__})"
        )


def apply_greta(
    target: torch.nn.Module | str,
    *,
    rms_norm: bool = True,
    rope: bool = True,
    attention: bool | Literal["always"] = True,
    swiglu: bool = True,
    add_rms_norm: bool = True,
    cross_entropy: bool = True,
) -> Patched:
    """Patch GRETA's kernels into `target`: a model instance, or a family name ("llama",
    "mistral", "qwen2", "qwen3", "gemma") to patch its classes before instantiation.

    One flag per kernel: ``swiglu`` covers Gemma's GeGLU, ``add_rms_norm`` fuses the
    post-attention residual add into the MLP's norm, ``cross_entropy`` makes the training
    loss of ``*ForCausalLM`` the fused linear cross-entropy (no logits in training).
    ``attention=True`` follows the arch's config table in training (SDPA where its
    backward is faster, e.g. on an H100); ``attention="always"`` runs GRETA's kernel there
    too. Inference (``generate``) runs GRETA's kernel either way.
    """
    import greta_core.torch  # noqa: F401  (registers torch.ops.greta.*)

    _check_transformers()
    family = _family_of(target)
    flags = dict(
        rms_norm=rms_norm, rope=rope, attention=attention, swiglu=swiglu,
        add_rms_norm=add_rms_norm, cross_entropy=cross_entropy,
    )  # fmt: skip
    forwards = {
        "rms_norm": ("RMSNorm", rms_norm_forward),
        "swiglu": ("MLP", glu_mlp_forward),
        "add_rms_norm": ("DecoderLayer", decoder_layer_forward),
        "cross_entropy": ("ForCausalLM", causal_lm_forward),
    }
    norm_cls = family.cls("RMSNorm")
    if isinstance(target, str):
        key: Any = family.model_type
        for kernel, (suffix, forward) in forwards.items():
            cls = family.cls(suffix)
            if flags[kernel] and cls is not None:
                _set(key, cls, "forward", forward)
        if family.norm_weight_offset and norm_cls is not None:
            _set(key, norm_cls, "_greta_weight_offset", True)
        if attention:
            from transformers import AttentionInterface

            local = AttentionInterface()
            local["sdpa"] = (
                attn.greta_attention_forward_always
                if attention == "always"
                else attn.greta_attention_forward
            )
            _set(key, family.module(), "ALL_ATTENTION_FUNCTIONS", local)
        mode = "classes"
    else:
        key = target
        for kernel, (suffix, forward) in forwards.items():
            cls = family.cls(suffix)
            if not flags[kernel] or cls is None:
                continue
            for module in target.modules():
                if isinstance(module, cls):
                    _set(key, module, "forward", types.MethodType(forward, module))
        if family.norm_weight_offset and norm_cls is not None:
            for module in target.modules():
                if isinstance(module, norm_cls):
                    _set(key, module, "_greta_weight_offset", True)
        if attention:
            attn.register()
            previous = target.config._attn_implementation
            target.set_attn_implementation(attn.NAME_ALWAYS if attention == "always" else attn.NAME)
            _log(key).append((None, _ATTN, previous))
        mode = "model"
    if rope:
        # A module-level function: patched (and reverted) for the family, in either mode.
        _patch_rope(family.model_type, family)
    return Patched(family.model_type, mode, tuple(k for k in KERNELS if flags[k]))


def revert_greta(target: torch.nn.Module | str) -> None:
    """Undo apply_greta on the same model instance or family name (the family's RoPE
    function, patched for the whole family, comes back with the family name)."""
    if isinstance(target, str):
        log = _saved_families.pop(_family_of(target).model_type, [])
    else:
        log = _saved_models.pop(target, [])
    for entry, attr, old in reversed(log):
        obj = target if entry is None else entry
        if attr == _ATTN:
            target.set_attn_implementation(old)
        elif old is _MISSING:
            delattr(obj, attr)
        else:
            setattr(obj, attr, old)
