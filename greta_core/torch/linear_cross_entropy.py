"""greta::linear_cross_entropy (its Python entry ``greta_core.torch._declared.ops``),
greta::linear_cross_entropy_fwd -> (loss, dhidden, dweight) and
greta::linear_cross_entropy_bwd, derived from their declarations
(ops/linear_cross_entropy.py: the public op's table dispatch and per-call flags are its
``Front``).

mutates_args=() although dh_into_hidden=True writes `hidden`: an op with declared mutations
cannot have register_autograd. The front passes True only on concrete tensors (never while
tracing, where functionalization would trust the schema)."""

from greta_core.ops.linear_cross_entropy import LINEAR_CROSS_ENTROPY_BWD, LINEAR_CROSS_ENTROPY_FWD
from greta_core.torch._declared import register

linear_cross_entropy_bwd = register(LINEAR_CROSS_ENTROPY_BWD)
linear_cross_entropy_fwd = register(LINEAR_CROSS_ENTROPY_FWD)
