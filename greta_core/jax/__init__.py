"""JAX binding: ``greta_core.jax.<name>`` runs the same Triton kernels through jax-triton.

Where jax-triton or a GPU is missing, a ``jax.numpy`` reference runs instead; which one
ran is recorded (``greta_core.observe.last_implementation``).
"""

from greta_core.jax._add_rms_norm import add_rms_norm
from greta_core.jax._attention import attention, attention_with_lse
from greta_core.jax._declared import bind, bind_public
from greta_core.jax._layer_norm import layer_norm
from greta_core.jax._rms_norm import rms_norm
from greta_core.ops.kv_cache import KV_CACHE_APPEND
from greta_core.ops.linear_cross_entropy import LINEAR_CROSS_ENTROPY_FWD
from greta_core.ops.matmul import MATMUL
from greta_core.ops.rope import ROPE, ROPE_POSITIONS
from greta_core.ops.softmax import SOFTMAX
from greta_core.ops.swiglu import GEGLU, SWIGLU
from greta_core.ops.vec_add import VEC_ADD

# Derived from their declarations (greta_core/ops/<op>.py).
geglu = bind(GEGLU)
kv_cache_append = bind(KV_CACHE_APPEND)
# Cross-entropy of hidden @ weight.T in token chunks, differentiable in hidden and weight:
# its forward computes the loss alone, the backward redoes each chunk (declared backward op).
linear_cross_entropy = bind_public(LINEAR_CROSS_ENTROPY_FWD)
matmul = bind(MATMUL)
rope = bind(ROPE)
rope_positions = bind(ROPE_POSITIONS)
softmax = bind(SOFTMAX)
swiglu = bind(SWIGLU)
vec_add = bind(VEC_ADD)

__all__ = [
    "add_rms_norm",
    "attention",
    "attention_with_lse",
    "geglu",
    "kv_cache_append",
    "layer_norm",
    "linear_cross_entropy",
    "matmul",
    "rms_norm",
    "rope",
    "rope_positions",
    "softmax",
    "swiglu",
    "vec_add",
]
