"""greta::rms_norm (user op, autograd) = greta::rms_norm_fwd -> (y, rstd), whose backward
is the triton_op greta::rms_norm_bwd, so compiled graphs keep both Triton kernels."""

from __future__ import annotations

from typing import Any

import torch
from torch.library import triton_op, wrap_triton

from greta_core.ops import rms_norm as raw
from greta_core.ops._rows import rows_view
from greta_core.torch._common import record_reference
from greta_core.torch._norms_common import compute_dtype, run_triton_on_cpu


def _reference_fwd(x: torch.Tensor, weight: torch.Tensor, eps: float):
    raw.validate(x, weight, reference=True)
    record_reference("rms_norm")
    ct = compute_dtype(x)
    xf = rows_view(x).to(ct)
    rstd = torch.rsqrt(xf.pow(2).mean(-1) + eps)
    y = (xf * rstd[:, None] * weight.to(ct)).to(x.dtype).reshape(x.shape)
    return y, rstd


def _reference_bwd(dy, x, weight, rstd):
    raw.validate_bwd(dy, x, weight, rstd, reference=True)
    record_reference("rms_norm_bwd")
    ct = compute_dtype(x)
    xhat = rows_view(x).to(ct) * rstd.to(ct)[:, None]
    dyf = rows_view(dy).to(ct)
    g = dyf * weight.to(ct)
    c = (g * xhat).mean(-1, keepdim=True)
    dx = ((g - xhat * c) * rstd.to(ct)[:, None]).to(x.dtype).reshape(x.shape)
    dw = (dyf * xhat).sum(0).to(weight.dtype)
    return dx, dw


@triton_op("greta::rms_norm_fwd", mutates_args=())
def rms_norm_fwd(
    x: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    if x.device.type == "cpu":
        return _reference_fwd(x, weight, eps)
    arch = raw.validate(x, weight)
    x2 = rows_view(x)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rstd = torch.empty(x2.shape[0], dtype=torch.float32, device=x.device)
    raw.launch_fwd(x2, weight, eps, y.view(x2.shape), rstd, arch, wrap=wrap_triton)
    return y, rstd


@rms_norm_fwd.register_kernel("cpu")
def _rms_norm_fwd_cpu(x: torch.Tensor, weight: torch.Tensor, eps: float):
    if run_triton_on_cpu(x, weight):
        return raw.rms_norm_fwd(x, weight, eps)
    return _reference_fwd(x, weight, eps)


@triton_op("greta::rms_norm_bwd", mutates_args=())
def rms_norm_bwd(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    if x.device.type == "cpu":
        return _reference_bwd(dy, x, weight, rstd)
    arch = raw.validate_bwd(dy, x, weight, rstd)
    x2 = rows_view(x)
    n_rows, n_cols = x2.shape
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    dw = torch.empty_like(weight)
    programs = raw.partial_rows(arch, n_rows, n_cols)
    partial = torch.empty((programs, n_cols), dtype=torch.float32, device=x.device)
    raw.launch_bwd(
        rows_view(dy), x2, weight, rstd, dx.view(x2.shape), partial, dw, arch, wrap=wrap_triton
    )
    return dx, dw


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
    return torch.ops.greta.rms_norm_fwd(x, weight, eps)[0]


# CompositeImplicitAutograd: decomposes into rms_norm_fwd (autograd, compile, fake all follow).
_lib.impl("rms_norm", _rms_norm, "CompositeImplicitAutograd")
