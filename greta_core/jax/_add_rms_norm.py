"""greta_core.jax.add_rms_norm, derived from its declaration (ops/add_rms_norm.py):
(rms_norm(x + residual) * weight, x + residual), differentiable (custom_vjp)."""

from greta_core.jax._declared import bind
from greta_core.ops.add_rms_norm import ADD_RMS_NORM

add_rms_norm = bind(ADD_RMS_NORM)
