"""greta::rope and greta::rope_positions, derived from their declarations (ops/rope.py):
each a CompositeImplicitAutograd front over the triton_op greta::<name>_fwd."""

from greta_core.ops.rope import ROPE, ROPE_POSITIONS
from greta_core.torch._declared import register

rope_fwd = register(ROPE)
rope_positions_fwd = register(ROPE_POSITIONS)
