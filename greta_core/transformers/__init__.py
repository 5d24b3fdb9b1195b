"""GRETA inside Hugging Face transformers models (needs the ``hf`` extra).

    from greta_core.transformers import apply_greta
    apply_greta(model)     # an instantiated LlamaForCausalLM, MistralForCausalLM, ...
    apply_greta("llama")   # or patch the family's classes before instantiation

Thin wrappers, one module per patched piece (``rms_norm``, ``rope``, ``attention``, ``mlp``,
``decoder``, ``causal_lm``) over the ``torch.ops.greta.*`` operators; which implementation
ran is in ``greta_core.observe``, and every fallback to the model's own code warns once
(:class:`GretaFallbackWarning`).
"""

from greta_core.transformers._fallback import GretaFallbackWarning
from greta_core.transformers._families import FAMILIES
from greta_core.transformers.apply import KERNELS, Patched, apply_greta, revert_greta

__all__ = ["FAMILIES", "KERNELS", "GretaFallbackWarning", "Patched", "apply_greta", "revert_greta"]
