"""greta::add_rms_norm -> (y, x + residual), greta::add_rms_norm_fwd -> (y, s, rstd) and
greta::add_rms_norm_bwd, derived from their declarations (ops/add_rms_norm.py)."""

from greta_core.ops.add_rms_norm import ADD_RMS_NORM, ADD_RMS_NORM_BWD
from greta_core.torch._declared import register

add_rms_norm_bwd = register(ADD_RMS_NORM_BWD)
add_rms_norm_fwd = register(ADD_RMS_NORM)
