"""greta::layer_norm (user op, autograd) = greta::layer_norm_fwd -> (y, mean, rstd), whose
backward is the triton_op greta::layer_norm_bwd."""

from __future__ import annotations

from typing import Any

import torch
from torch.library import triton_op, wrap_triton

from greta_core.ops import layer_norm as raw
from greta_core.ops._rows import rows_view
from greta_core.torch._common import record_reference
from greta_core.torch._norms_common import compute_dtype, run_triton_on_cpu


def _reference_fwd(x, weight, bias, eps):
    raw.validate(x, weight, bias, reference=True)
    record_reference("layer_norm")
    ct = compute_dtype(x)
    xf = rows_view(x).to(ct)
    mean = xf.mean(-1)
    xc = xf - mean[:, None]
    rstd = torch.rsqrt(xc.pow(2).mean(-1) + eps)
    y = xc * rstd[:, None] * weight.to(ct)
    if bias is not None:
        y = y + bias.to(ct)
    return y.to(x.dtype).reshape(x.shape), mean, rstd


def _reference_bwd(dy, x, weight, mean, rstd):
    raw.validate_bwd(dy, x, weight, mean, rstd, reference=True)
    record_reference("layer_norm_bwd")
    ct = compute_dtype(x)
    r = rstd.to(ct)[:, None]
    xhat = (rows_view(x).to(ct) - mean.to(ct)[:, None]) * r
    dyf = rows_view(dy).to(ct)
    g = dyf * weight.to(ct)
    c1 = (g * xhat).mean(-1, keepdim=True)
    c2 = g.mean(-1, keepdim=True)
    dx = ((g - xhat * c1 - c2) * r).to(x.dtype).reshape(x.shape)
    return dx, (dyf * xhat).sum(0).to(weight.dtype), dyf.sum(0).to(weight.dtype)


@triton_op("greta::layer_norm_fwd", mutates_args=())
def layer_norm_fwd(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if x.device.type == "cpu":
        return _reference_fwd(x, weight, bias, eps)
    arch = raw.validate(x, weight, bias)
    x2 = rows_view(x)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    mean = torch.empty(x2.shape[0], dtype=torch.float32, device=x.device)
    rstd = torch.empty_like(mean)
    raw.launch_fwd(x2, weight, bias, eps, y.view(x2.shape), mean, rstd, arch, wrap=wrap_triton)
    return y, mean, rstd


@layer_norm_fwd.register_kernel("cpu")
def _layer_norm_fwd_cpu(x, weight, bias, eps):
    if run_triton_on_cpu(x, weight, bias):
        return raw.layer_norm_fwd(x, weight, bias, eps)
    return _reference_fwd(x, weight, bias, eps)


@triton_op("greta::layer_norm_bwd", mutates_args=())
def layer_norm_bwd(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if x.device.type == "cpu":
        return _reference_bwd(dy, x, weight, mean, rstd)
    arch = raw.validate_bwd(dy, x, weight, mean, rstd)
    x2 = rows_view(x)
    n_rows, n_cols = x2.shape
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    dw = torch.empty_like(weight)
    db = torch.empty_like(weight)
    programs = raw.partial_rows(arch, n_rows, n_cols)
    dw_partial = torch.empty((programs, n_cols), dtype=torch.float32, device=x.device)
    db_partial = torch.empty_like(dw_partial)
    raw.launch_bwd(
        rows_view(dy), x2, weight, mean, rstd, dx.view(x2.shape), dw_partial, db_partial,
        dw, db, arch, wrap=wrap_triton,
    )  # fmt: skip
    return dx, dw, db


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
    return torch.ops.greta.layer_norm_fwd(x, weight, bias, eps)[0]


_lib.impl("layer_norm", _layer_norm, "CompositeImplicitAutograd")
