"""greta::rms_norm, greta::rms_norm_fwd -> (y, rstd) and greta::rms_norm_bwd, derived from
their declarations (ops/rms_norm.py)."""

from greta_core.ops.rms_norm import RMS_NORM, RMS_NORM_BWD
from greta_core.torch._declared import register

rms_norm_bwd = register(RMS_NORM_BWD)
rms_norm_fwd = register(RMS_NORM)
