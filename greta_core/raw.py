"""Raw Triton API: framework tensors in, GRETA Triton kernels launched, tensors out.

These launch the Triton kernels directly: GPU tensors, or CPU tensors under
``TRITON_INTERPRET=1``. Most users want ``torch.ops.greta.*`` (CPU reference and
autograd included) or ``greta_core.jax``.
"""

from greta_core.errors import GretaInputError
from greta_core.ops.add_rms_norm import add_rms_norm, add_rms_norm_bwd, add_rms_norm_fwd
from greta_core.ops.attention import attention, attention_with_lse
from greta_core.ops.attention_bwd import attention_bwd
from greta_core.ops.kv_cache import kv_cache_append
from greta_core.ops.layer_norm import layer_norm, layer_norm_bwd, layer_norm_fwd
from greta_core.ops.linear_cross_entropy import (
    linear_cross_entropy,
    linear_cross_entropy_bwd,
    linear_cross_entropy_fwd,
)
from greta_core.ops.matmul import matmul
from greta_core.ops.rms_norm import rms_norm, rms_norm_bwd, rms_norm_fwd
from greta_core.ops.rope import rope, rope_positions
from greta_core.ops.softmax import softmax, softmax_bwd
from greta_core.ops.swiglu import geglu, geglu_bwd, swiglu, swiglu_bwd
from greta_core.ops.vec_add import vec_add

__all__ = [
    "GretaInputError",
    "add_rms_norm",
    "add_rms_norm_bwd",
    "add_rms_norm_fwd",
    "attention",
    "attention_bwd",
    "attention_with_lse",
    "geglu",
    "geglu_bwd",
    "kv_cache_append",
    "layer_norm",
    "layer_norm_bwd",
    "layer_norm_fwd",
    "linear_cross_entropy",
    "linear_cross_entropy_bwd",
    "linear_cross_entropy_fwd",
    "matmul",
    "rms_norm",
    "rms_norm_bwd",
    "rms_norm_fwd",
    "rope",
    "rope_positions",
    "softmax",
    "softmax_bwd",
    "swiglu",
    "swiglu_bwd",
    "vec_add",
]
