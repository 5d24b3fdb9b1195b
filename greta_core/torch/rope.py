"""greta::rope (x, cos, sin) and greta::rope_positions (x, positions, theta): rotate-half
RoPE on [batch, seq, heads, head_dim]; the backward is the inverse rotation (same ops with
inverse=True). cos/sin/positions get no gradient."""

from __future__ import annotations

from typing import Any

import torch
from torch.library import triton_op, wrap_triton

from greta_core import reference
from greta_core.ops import rope as raw
from greta_core.torch._common import record_reference
from greta_core.torch._norms_common import run_triton_on_cpu, takes_reference


def _reference(x, cos, sin, inverse):
    raw.validate(x, cos, sin, reference=True)
    record_reference("rope")
    return reference.rope(x, cos, sin, inverse)


def _reference_positions(x, positions, theta, inverse):
    raw.validate_positions(x, positions, theta, reference=True)
    record_reference("rope_positions")
    return reference.rope_positions(x, positions, theta, inverse)


@triton_op("greta::rope", mutates_args=())
def rope(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool = False
) -> torch.Tensor:
    if takes_reference(x):
        return _reference(x, cos, sin, inverse)
    return raw.rope(x, cos, sin, inverse=inverse, wrap=wrap_triton)


@rope.register_kernel("cpu")
def _rope_cpu(x, cos, sin, inverse=False):
    if run_triton_on_cpu(x, cos, sin):
        return raw.rope(x, cos, sin, inverse=inverse)
    return _reference(x, cos, sin, inverse)


@triton_op("greta::rope_positions", mutates_args=())
def rope_positions(
    x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0, inverse: bool = False
) -> torch.Tensor:
    if takes_reference(x):
        return _reference_positions(x, positions, theta, inverse)
    return raw.rope_positions(x, positions, theta, inverse=inverse, wrap=wrap_triton)


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
