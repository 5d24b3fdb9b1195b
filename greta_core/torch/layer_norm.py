"""greta::layer_norm (user op, autograd) = greta::layer_norm_fwd -> (y, mean, rstd), whose
backward is the triton_op greta::layer_norm_bwd."""

from __future__ import annotations

from typing import Any

import torch
from torch.library import triton_op, wrap_triton

from greta_core import reference
from greta_core.ops import layer_norm as raw
from greta_core.torch._common import record_reference
from greta_core.torch._norms_common import KERNEL_DTYPES, run_triton_on_cpu, takes_reference


def _reference_fwd(x, weight, bias, eps):
    raw.validate(x, weight, bias, reference=True)
    record_reference("layer_norm")
    return reference.layer_norm_fwd(x, weight, bias, eps)


def _reference_bwd(dy, x, weight, mean, rstd):
    raw.validate_bwd(dy, x, weight, mean, rstd, reference=True)
    record_reference("layer_norm_bwd")
    return reference.layer_norm_bwd(dy, x, weight, mean, rstd)


@triton_op("greta::layer_norm_fwd", mutates_args=())
def layer_norm_fwd(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if takes_reference(x):
        return _reference_fwd(x, weight, bias, eps)
    return raw.layer_norm_fwd(x, weight, bias, eps, wrap=wrap_triton)


@layer_norm_fwd.register_kernel("cpu")
def _layer_norm_fwd_cpu(x, weight, bias, eps):
    if run_triton_on_cpu(x, weight, bias):
        return raw.layer_norm_fwd(x, weight, bias, eps)
    return _reference_fwd(x, weight, bias, eps)


@triton_op("greta::layer_norm_bwd", mutates_args=())
def layer_norm_bwd(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if takes_reference(x):
        return _reference_bwd(dy, x, weight, mean, rstd)
    return raw.layer_norm_bwd(dy, x, weight, mean, rstd, wrap=wrap_triton)


@layer_norm_bwd.register_kernel("cpu")
def _layer_norm_bwd_cpu(dy, x, weight, mean, rstd):
    if run_triton_on_cpu(dy, x, weight, mean, rstd):
        return raw.layer_norm_bwd(dy, x, weight, mean, rstd)
    return _reference_bwd(dy, x, weight, mean, rstd)


def _setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
    x, weight, bias, _eps = inputs
    _y, mean, rstd = output
    ctx.has_bias = bias is not None
    ctx.save_for_backward(x, weight, mean, rstd)
    ctx.mark_non_differentiable(mean, rstd)


def _backward(ctx: Any, dy: torch.Tensor, _dmean: Any, _drstd: Any):
    x, weight, mean, rstd = ctx.saved_tensors
    dx, dw, db = torch.ops.greta.layer_norm_bwd(dy.contiguous(), x, weight, mean, rstd)
    return dx, dw, (db if ctx.has_bias else None), None


layer_norm_fwd.register_autograd(_backward, setup_context=_setup_context)

_lib = torch.library.Library("greta", "FRAGMENT")
_lib.define("layer_norm(Tensor x, Tensor weight, Tensor? bias=None, float eps=1e-05) -> Tensor")


def _layer_norm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, eps: float = 1e-5
) -> torch.Tensor:
    if x.dtype in KERNEL_DTYPES:  # see torch/rms_norm.py (no mean/rstd buffers)
        y = raw.layer_norm_if_eager(x, weight, bias, eps)
        if y is not None:
            return y
    return torch.ops.greta.layer_norm_fwd(x, weight, bias, eps)[0]


_lib.impl("layer_norm", _layer_norm, "CompositeImplicitAutograd")
