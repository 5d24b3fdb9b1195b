"""greta::layer_norm, greta::layer_norm_fwd -> (y, mean, rstd) and greta::layer_norm_bwd,
derived from their declarations (ops/layer_norm.py)."""

from greta_core.ops.layer_norm import LAYER_NORM, LAYER_NORM_BWD
from greta_core.torch._declared import register

layer_norm_bwd = register(LAYER_NORM_BWD)
layer_norm_fwd = register(LAYER_NORM)
