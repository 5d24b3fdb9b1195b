"""JAX binding: ``greta_core.jax.<name>`` runs the same Triton kernels through jax-triton.

Where jax-triton or a GPU is missing, a ``jax.numpy`` reference runs instead; which one
ran is recorded (``greta_core.observe.last_implementation``).
"""

from greta_core.jax._add_rms_norm import add_rms_norm
from greta_core.jax._attention import attention, attention_with_lse
from greta_core.jax._kv_cache import kv_cache_append
from greta_core.jax._layer_norm import layer_norm
from greta_core.jax._linear_cross_entropy import linear_cross_entropy
from greta_core.jax._matmul import matmul
from greta_core.jax._rms_norm import rms_norm
from greta_core.jax._rope import rope, rope_positions
from greta_core.jax._softmax import softmax
from greta_core.jax._swiglu import geglu, swiglu
from greta_core.jax._vec_add import vec_add

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
