"""greta::rope (x, cos, sin) and greta::rope_positions (x, positions, theta): rotate-half
RoPE on [batch, seq, heads, head_dim]; cos/sin/positions get no gradient.

Each is a CompositeImplicitAutograd op (user-facing; its eager hot path launches the plan
directly, see ops/_calls.py) over a triton_op (greta::rope_fwd, greta::rope_positions_fwd)
that carries autograd (the backward is the inverse rotation: the same op with
inverse=True) and torch.compile, so compiled graphs still see the kernel."""

from __future__ import annotations

from typing import Any

import torch
from torch.library import triton_op, wrap_triton

from greta_core import reference
from greta_core.ops import rope as raw
from greta_core.torch._common import record_reference
from greta_core.torch._norms_common import KERNEL_DTYPES, run_triton_on_cpu, takes_reference


def _reference(x, cos, sin, inverse):
    raw.validate(x, cos, sin, reference=True)
    record_reference("rope")
    return reference.rope(x, cos, sin, inverse)


def _reference_positions(x, positions, theta, inverse):
    raw.validate_positions(x, positions, theta, reference=True)
    record_reference("rope_positions")
    return reference.rope_positions(x, positions, theta, inverse)


@triton_op("greta::rope_fwd", mutates_args=())
def rope_fwd(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool = False
) -> torch.Tensor:
    if takes_reference(x):
        return _reference(x, cos, sin, inverse)
    return raw.rope(x, cos, sin, inverse=inverse, wrap=wrap_triton)


@rope_fwd.register_kernel("cpu")
def _rope_fwd_cpu(x, cos, sin, inverse=False):
    if run_triton_on_cpu(x, cos, sin):
        return raw.rope(x, cos, sin, inverse=inverse)
    return _reference(x, cos, sin, inverse)


@triton_op("greta::rope_positions_fwd", mutates_args=())
def rope_positions_fwd(
    x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0, inverse: bool = False
) -> torch.Tensor:
    if takes_reference(x):
        return _reference_positions(x, positions, theta, inverse)
    return raw.rope_positions(x, positions, theta, inverse=inverse, wrap=wrap_triton)


@rope_positions_fwd.register_kernel("cpu")
def _rope_positions_fwd_cpu(x, positions, theta=10000.0, inverse=False):
    if run_triton_on_cpu(x):
        return raw.rope_positions(x, positions, theta, inverse=inverse)
    return _reference_positions(x, positions, theta, inverse)


def _setup_rope(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    _x, cos, sin, inverse = inputs
    ctx.save_for_backward(cos, sin)
    ctx.inverse = inverse


def _backward_rope(ctx: Any, dy: torch.Tensor):
    cos, sin = ctx.saved_tensors
    # The public op: an eager backward (no create_graph) takes its hot path too.
    return torch.ops.greta.rope(dy, cos, sin, not ctx.inverse), None, None, None


def _setup_positions(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    _x, positions, theta, inverse = inputs
    ctx.save_for_backward(positions)
    ctx.theta, ctx.inverse = theta, inverse


def _backward_positions(ctx: Any, dy: torch.Tensor):
    (positions,) = ctx.saved_tensors
    dx = torch.ops.greta.rope_positions(dy, positions, ctx.theta, not ctx.inverse)
    return dx, None, None, None


rope_fwd.register_autograd(_backward_rope, setup_context=_setup_rope)
rope_positions_fwd.register_autograd(_backward_positions, setup_context=_setup_positions)

_lib = torch.library.Library("greta", "FRAGMENT")
_lib.define("rope(Tensor x, Tensor cos, Tensor sin, bool inverse=False) -> Tensor")
_lib.define("rope_positions(Tensor x, Tensor positions, float theta=10000.0, bool inverse=False)"
            " -> Tensor")  # fmt: skip


def _rope(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool = False
) -> torch.Tensor:
    if x.dtype in KERNEL_DTYPES:
        # Plain GPU tensors, no gradient, no tracing or mode (ops._calls.eager_raw): the
        # plan's ready launch, without a second dispatcher hop and the custom-op autograd
        # layer. Autograd, torch.compile and fake tensors take rope_fwd.
        y = raw.rope_if_eager(x, cos, sin, inverse)
        if y is not None:
            return y
    return torch.ops.greta.rope_fwd(x, cos, sin, inverse)


def _rope_positions(
    x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0, inverse: bool = False
) -> torch.Tensor:
    if x.dtype in KERNEL_DTYPES:  # as _rope
        y = raw.rope_positions_if_eager(x, positions, theta, inverse)
        if y is not None:
            return y
    return torch.ops.greta.rope_positions_fwd(x, positions, theta, inverse)


# CompositeImplicitAutograd: decomposes into the triton_ops (autograd, compile, fake follow).
_lib.impl("rope", _rope, "CompositeImplicitAutograd")
_lib.impl("rope_positions", _rope_positions, "CompositeImplicitAutograd")
