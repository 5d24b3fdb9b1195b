"""PyTorch binding: importing this registers every GRETA op as ``torch.ops.greta.<name>``.

Each op is a ``torch.library.triton_op`` (so ``torch.compile`` sees the Triton kernel),
with a CPU kernel from torch reference code (or the real Triton kernel under
``TRITON_INTERPRET=1``) and autograd where the op has a backward.
"""

from greta_core.torch import (
    attention,  # noqa: F401  (greta::attention, greta::attention_with_lse)
    matmul,  # noqa: F401  (registers torch.ops.greta.matmul)
    vec_add,  # noqa: F401  (registers torch.ops.greta.vec_add)
)
