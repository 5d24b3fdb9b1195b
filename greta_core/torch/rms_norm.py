"""greta::rms_norm (user op, autograd) = greta::rms_norm_fwd -> (y, rstd), whose backward
is the triton_op greta::rms_norm_bwd, so compiled graphs keep both Triton kernels."""

from __future__ import annotations

from typing import Any

import torch
from torch.library import triton_op, wrap_triton

from greta_core import reference
from greta_core.ops import rms_norm as raw
from greta_core.torch._common import record_reference
from greta_core.torch._norms_common import KERNEL_DTYPES, run_triton_on_cpu, takes_reference


def _reference_fwd(x: torch.Tensor, weight: torch.Tensor, eps: float):
    raw.validate(x, weight, reference=True)
    record_reference("rms_norm")
    return reference.rms_norm_fwd(x, weight, eps)


def _reference_bwd(dy, x, weight, rstd):
    raw.validate_bwd(dy, x, weight, rstd, reference=True)
    record_reference("rms_norm_bwd")
    return reference.rms_norm_bwd(dy, x, weight, rstd)


@triton_op("greta::rms_norm_fwd", mutates_args=())
def rms_norm_fwd(
    x: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    if takes_reference(x):
        return _reference_fwd(x, weight, eps)
    return raw.rms_norm_fwd(x, weight, eps, wrap=wrap_triton)


@rms_norm_fwd.register_kernel("cpu")
def _rms_norm_fwd_cpu(x: torch.Tensor, weight: torch.Tensor, eps: float):
    if run_triton_on_cpu(x, weight):
        return raw.rms_norm_fwd(x, weight, eps)
    return _reference_fwd(x, weight, eps)


@triton_op("greta::rms_norm_bwd", mutates_args=())
def rms_norm_bwd(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    if takes_reference(x):
        return _reference_bwd(dy, x, weight, rstd)
    return raw.rms_norm_bwd(dy, x, weight, rstd, wrap=wrap_triton)


@rms_norm_bwd.register_kernel("cpu")
def _rms_norm_bwd_cpu(dy, x, weight, rstd):
    if run_triton_on_cpu(dy, x, weight, rstd):
        return raw.rms_norm_bwd(dy, x, weight, rstd)
    return _reference_bwd(dy, x, weight, rstd)


def _setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
    x, weight, _eps = inputs
    _y, rstd = output
    ctx.save_for_backward(x, weight, rstd)
    ctx.mark_non_differentiable(rstd)


def _backward(ctx: Any, dy: torch.Tensor, _drstd: torch.Tensor | None):
    x, weight, rstd = ctx.saved_tensors
    dx, dw = torch.ops.greta.rms_norm_bwd(dy.contiguous(), x, weight, rstd)
    return dx, dw, None


rms_norm_fwd.register_autograd(_backward, setup_context=_setup_context)

_lib = torch.library.Library("greta", "FRAGMENT")
_lib.define("rms_norm(Tensor x, Tensor weight, float eps=1e-06) -> Tensor")


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    if x.dtype in KERNEL_DTYPES:
        # Plain GPU tensors, no gradient, no tracing or mode (ops._calls.eager_raw): the
        # plan launches without a second dispatcher hop and the custom-op autograd layer.
        # Autograd, torch.compile and fake tensors take rms_norm_fwd, so compiled graphs
        # still see the kernel. No backward follows: the y-only plan (no rstd buffer).
        y = raw.rms_norm_if_eager(x, weight, eps)
        if y is not None:
            return y
    return torch.ops.greta.rms_norm_fwd(x, weight, eps)[0]


# CompositeImplicitAutograd: decomposes into rms_norm_fwd (autograd, compile, fake all follow).
_lib.impl("rms_norm", _rms_norm, "CompositeImplicitAutograd")
