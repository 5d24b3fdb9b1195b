"""PyTorch binding: importing this registers every GRETA op as ``torch.ops.greta.<name>``.

Each op is a ``torch.library.triton_op`` (so ``torch.compile`` sees the Triton kernel), or
a CompositeImplicitAutograd front over one whose eager hot path launches the plan directly
(see ``greta_core/ops/_calls.py``). The triton_ops have a CPU kernel from torch reference
code (the real Triton kernel under ``TRITON_INTERPRET=1`` with ``GRETA_TRITON_ON_CPU=1``)
and autograd where the op has a backward.
"""

from greta_core.torch._deferred_scan import deferred_kernel_scan

with deferred_kernel_scan():  # no torch._dynamo at import time: see _deferred_scan
    from greta_core.torch import (
        add_rms_norm,  # noqa: F401  (greta::add_rms_norm[_fwd|_bwd])
        attention,  # noqa: F401  (greta::attention, greta::attention_with_lse)
        kv_cache,  # noqa: F401  (greta::kv_cache_append)
        layer_norm,  # noqa: F401  (greta::layer_norm[_fwd|_bwd])
        linear_cross_entropy,  # noqa: F401  (greta::linear_cross_entropy[_fwd|_bwd])
        matmul,  # noqa: F401  (greta::matmul[_fwd])
        rms_norm,  # noqa: F401  (greta::rms_norm[_fwd|_bwd])
        rope,  # noqa: F401  (greta::rope, greta::rope_positions)
        softmax,  # noqa: F401  (greta::softmax[_fwd|_bwd])
        swiglu,  # noqa: F401  (greta::swiglu[_bwd], greta::geglu[_bwd])
        vec_add,  # noqa: F401  (greta::vec_add[_fwd])
    )
