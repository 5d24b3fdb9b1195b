"""greta_core.jax.attention and attention_with_lse, derived from the declaration
(ops/attention.py): the Triton forward and backward through jax-triton on a GPU, the
reference elsewhere."""

from __future__ import annotations

from greta_core.jax._declared import bind, bind_fwd
from greta_core.ops import attention_bwd  # noqa: F401  (declares the backward's kernel op)
from greta_core.ops.attention import ATTENTION

attention = bind(ATTENTION)
attention_with_lse = bind_fwd(ATTENTION, "attention_with_lse")
