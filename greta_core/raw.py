"""Raw Triton API: framework tensors in, GRETA Triton kernels launched, tensors out.

These launch the Triton kernels directly: GPU tensors, or CPU tensors under
``TRITON_INTERPRET=1``. Most users want ``torch.ops.greta.*`` (CPU reference and
autograd included) or ``greta_core.jax``.
"""

from greta_core.ops._validate import GretaInputError
from greta_core.ops.attention import attention, attention_with_lse
from greta_core.ops.matmul import matmul
from greta_core.ops.vec_add import vec_add

__all__ = ["GretaInputError", "vec_add"]
__all__ += ["attention", "attention_with_lse", "matmul"]
