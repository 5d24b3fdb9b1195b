"""PyTorch binding: importing this registers every GRETA op as ``torch.ops.greta.<name>``.

Each op is a ``torch.library.triton_op`` (so ``torch.compile`` sees the Triton kernel), or
a CompositeImplicitAutograd front over one whose eager hot path launches the plan directly
(see ``greta_core/ops/_calls.py``). The triton_ops have a CPU kernel from torch reference
code (the real Triton kernel under ``TRITON_INTERPRET=1`` with ``GRETA_TRITON_ON_CPU=1``)
and autograd where the op has a backward.
"""

from greta_core.torch._deferred_scan import deferred_kernel_scan

with deferred_kernel_scan():  # no torch._dynamo at import time: see _deferred_scan
    from greta_core.ops import (  # declared ops (ops/declare.py), registered below
        kv_cache,  # noqa: F401  (greta::kv_cache_append)
        matmul,  # noqa: F401  (greta::matmul[_fwd])
        rope,  # noqa: F401  (greta::rope[_fwd], greta::rope_positions[_fwd])
        softmax,  # noqa: F401  (greta::softmax[_fwd], greta::softmax_bwd)
        swiglu,  # noqa: F401  (greta::swiglu[_fwd|_bwd|_bwd_], greta::geglu[...])
        vec_add,  # noqa: F401  (greta::vec_add[_fwd])
    )
    from greta_core.torch import (
        add_rms_norm,  # noqa: F401  (greta::add_rms_norm[_fwd|_bwd])
        attention,  # noqa: F401  (greta::attention[_fwd|_bwd|_with_lse])
        layer_norm,  # noqa: F401  (greta::layer_norm[_fwd|_bwd])
        linear_cross_entropy,  # noqa: F401  (greta::linear_cross_entropy[_fwd|_bwd])
        rms_norm,  # noqa: F401  (greta::rms_norm[_fwd|_bwd])
    )
    from greta_core.torch._declared import register_declared

    register_declared()
