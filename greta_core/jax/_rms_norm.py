"""greta_core.jax.rms_norm, derived from its declaration (ops/rms_norm.py): differentiable
in x and weight (custom_vjp over the declared backward)."""

from greta_core.jax._declared import bind
from greta_core.ops.rms_norm import RMS_NORM

rms_norm = bind(RMS_NORM)
