"""RMSNorm module forwards: ``torch.ops.greta.rms_norm`` in place of the model's own (its
Python entry, ``greta_core.torch._declared.ops``: no dispatcher hop on the eager paths)."""

from __future__ import annotations

import torch

from greta_core.torch._declared import ops as greta_ops


def norm_weight(module: torch.nn.Module) -> torch.Tensor:
    """The scale the norm multiplies by: Gemma's norms store it offset by one."""
    weight = module.weight
    return 1.0 + weight if getattr(module, "_greta_weight_offset", False) else weight


def norm_eps(module: torch.nn.Module) -> float:
    eps = getattr(module, "variance_epsilon", None)
    return float(module.eps if eps is None else eps)


def rms_norm_forward(self: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    return greta_ops.rms_norm(hidden_states, norm_weight(self), norm_eps(self))
