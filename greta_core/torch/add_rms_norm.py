"""greta::add_rms_norm (user op, autograd) -> (y, x + residual) = greta::add_rms_norm_fwd
-> (y, s, rstd), whose backward is the triton_op greta::add_rms_norm_bwd."""

from __future__ import annotations

from typing import Any

import torch
from torch.library import triton_op, wrap_triton

from greta_core import reference
from greta_core.ops import add_rms_norm as raw
from greta_core.torch._common import record_reference
from greta_core.torch._norms_common import KERNEL_DTYPES, run_triton_on_cpu, takes_reference


def _reference_fwd(x, residual, weight, eps):
    raw.validate(x, residual, weight, reference=True)
    record_reference("add_rms_norm")
    return reference.add_rms_norm_fwd(x, residual, weight, eps)


def _reference_bwd(dy, ds, s, weight, rstd):
    raw.validate_bwd(dy, ds, s, weight, rstd, reference=True)
    record_reference("add_rms_norm_bwd")
    return reference.add_rms_norm_bwd(dy, ds, s, weight, rstd)


@triton_op("greta::add_rms_norm_fwd", mutates_args=())
def add_rms_norm_fwd(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if takes_reference(x):
        return _reference_fwd(x, residual, weight, eps)
    return raw.add_rms_norm_fwd(x, residual, weight, eps, wrap=wrap_triton)


@add_rms_norm_fwd.register_kernel("cpu")
def _add_rms_norm_fwd_cpu(x, residual, weight, eps):
    if run_triton_on_cpu(x, residual, weight):
        return raw.add_rms_norm_fwd(x, residual, weight, eps)
    return _reference_fwd(x, residual, weight, eps)


@triton_op("greta::add_rms_norm_bwd", mutates_args=())
def add_rms_norm_bwd(
    dy: torch.Tensor, ds: torch.Tensor, s: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    if takes_reference(s):
        return _reference_bwd(dy, ds, s, weight, rstd)
    return raw.add_rms_norm_bwd(dy, ds, s, weight, rstd, wrap=wrap_triton)


@add_rms_norm_bwd.register_kernel("cpu")
def _add_rms_norm_bwd_cpu(dy, ds, s, weight, rstd):
    if run_triton_on_cpu(dy, ds, s, weight, rstd):
        return raw.add_rms_norm_bwd(dy, ds, s, weight, rstd)
    return _reference_bwd(dy, ds, s, weight, rstd)


def _setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
    _x, _residual, weight, _eps = inputs
    _y, s, rstd = output
    ctx.save_for_backward(s, weight, rstd)
    ctx.mark_non_differentiable(rstd)


def _backward(ctx: Any, dy: torch.Tensor | None, ds: torch.Tensor | None, _drstd: Any):
    s, weight, rstd = ctx.saved_tensors
    dy = torch.zeros_like(s) if dy is None else dy.contiguous()
    ds = torch.zeros_like(s) if ds is None else ds.contiguous()
    dx, dw = torch.ops.greta.add_rms_norm_bwd(dy, ds, s, weight, rstd)
    return dx, dx, dw, None


add_rms_norm_fwd.register_autograd(_backward, setup_context=_setup_context)

_lib = torch.library.Library("greta", "FRAGMENT")
_lib.define(
    "add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps=1e-06) -> (Tensor, Tensor)"
)


def _add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    if x.dtype in KERNEL_DTYPES:
        # Plain GPU tensors, no gradient, no tracing (a decode step): the plan launches
        # without the custom-op dispatch, and without rstd (no backward follows); autograd
        # and torch.compile take add_rms_norm_fwd.
        done = raw.add_rms_norm_if_eager(x, residual, weight, eps)
        if done is not None:
            return done
    y, s, _ = torch.ops.greta.add_rms_norm_fwd(x, residual, weight, eps)
    return y, s


# CompositeImplicitAutograd: decomposes into add_rms_norm_fwd (autograd, compile, fake follow).
_lib.impl("add_rms_norm", _add_rms_norm, "CompositeImplicitAutograd")
