"""greta::rope (x, cos, sin) and greta::rope_positions (x, positions, theta): rotate-half
RoPE on [batch, seq, heads, head_dim]; the backward is the inverse rotation (same ops with
inverse=True). cos/sin/positions get no gradient."""

from __future__ import annotations

from typing import Any

import torch
from torch.library import triton_op, wrap_triton

from greta_core.ops import rope as raw
from greta_core.torch._common import record_reference
from greta_core.torch._norms_common import compute_dtype, run_triton_on_cpu


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool) -> torch.Tensor:
    """cos/sin: [seq, d/2] or [batch|1, seq, d/2] in the compute dtype."""
    ct = compute_dtype(x)
    c = cos.to(ct).unsqueeze(-2)
    s = sin.to(ct).unsqueeze(-2)
    if c.dim() == 3:
        c, s = c.unsqueeze(0), s.unsqueeze(0)
    if inverse:
        s = -s
    half = x.shape[-1] // 2
    xf = x.to(ct)
    x1, x2 = xf[..., :half], xf[..., half:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)


def angles(
    positions: torch.Tensor, theta: float, head_dim: int, dtype: torch.dtype
) -> torch.Tensor:
    """pos * theta^(-2i/head_dim): [..., head_dim/2]."""
    i = torch.arange(head_dim // 2, device=positions.device, dtype=dtype)
    inv_freq = theta ** (-(2.0 * i) / head_dim)
    return positions.to(dtype)[..., None] * inv_freq


def _reference(x, cos, sin, inverse):
    raw.validate(x, cos, sin, reference=True)
    record_reference("rope")
    return _rotate(x, cos, sin, inverse)


def _reference_positions(x, positions, theta, inverse):
    raw.validate_positions(x, positions, theta, reference=True)
    record_reference("rope_positions")
    ang = angles(positions, theta, x.shape[-1], compute_dtype(x))
    return _rotate(x, ang.cos(), ang.sin(), inverse)


@triton_op("greta::rope", mutates_args=())
def rope(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool = False
) -> torch.Tensor:
    if x.device.type == "cpu":
        return _reference(x, cos, sin, inverse)
    arch = raw.validate(x, cos, sin)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    raw.launch(x, cos, sin, out, arch, inverse, wrap=wrap_triton)
    return out


@rope.register_kernel("cpu")
def _rope_cpu(x, cos, sin, inverse=False):
    if run_triton_on_cpu(x, cos, sin):
        return raw.rope(x, cos, sin, inverse=inverse)
    return _reference(x, cos, sin, inverse)


@triton_op("greta::rope_positions", mutates_args=())
def rope_positions(
    x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0, inverse: bool = False
) -> torch.Tensor:
    if x.device.type == "cpu":
        return _reference_positions(x, positions, theta, inverse)
    arch = raw.validate_positions(x, positions, theta)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    raw.launch_positions(x, positions, theta, out, arch, inverse, wrap=wrap_triton)
    return out


@rope_positions.register_kernel("cpu")
def _rope_positions_cpu(x, positions, theta=10000.0, inverse=False):
    if run_triton_on_cpu(x):
        return raw.rope_positions(x, positions, theta, inverse=inverse)
    return _reference_positions(x, positions, theta, inverse)


def _setup_rope(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    _x, cos, sin, inverse = inputs
    ctx.save_for_backward(cos, sin)
    ctx.inverse = inverse


def _backward_rope(ctx: Any, dy: torch.Tensor):
    cos, sin = ctx.saved_tensors
    return torch.ops.greta.rope(dy, cos, sin, not ctx.inverse), None, None, None


def _setup_positions(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    _x, positions, theta, inverse = inputs
    ctx.save_for_backward(positions)
    ctx.theta, ctx.inverse = theta, inverse


def _backward_positions(ctx: Any, dy: torch.Tensor):
    (positions,) = ctx.saved_tensors
    dx = torch.ops.greta.rope_positions(dy, positions, ctx.theta, not ctx.inverse)
    return dx, None, None, None


rope.register_autograd(_backward_rope, setup_context=_setup_rope)
rope_positions.register_autograd(_backward_positions, setup_context=_setup_positions)
