"""greta_core.jax.layer_norm, derived from its declaration (ops/layer_norm.py):
differentiable in x, weight and bias (custom_vjp over the declared backward)."""

from greta_core.jax._declared import bind
from greta_core.ops.layer_norm import LAYER_NORM

layer_norm = bind(LAYER_NORM)
