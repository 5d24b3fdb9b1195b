"""greta_core.jax.rope / rope_positions, derived from their declarations (ops/rope.py):
differentiable in x (custom_vjp: the inverse rotation)."""

from greta_core.jax._declared import bind
from greta_core.ops.rope import ROPE, ROPE_POSITIONS

rope = bind(ROPE)
rope_positions = bind(ROPE_POSITIONS)
