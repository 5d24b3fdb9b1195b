"""greta::softmax over the last dim: a user op (CompositeImplicitAutograd; its eager hot
path launches the plan directly, see ops/_calls.py) over the triton_op greta::softmax_fwd,
whose backward is the triton_op greta::softmax_bwd, so compiled graphs keep both kernels."""

from __future__ import annotations

from typing import Any

import torch
from torch.library import triton_op, wrap_triton

from greta_core import reference
from greta_core.ops import softmax as raw
from greta_core.torch._common import record_reference
from greta_core.torch._norms_common import KERNEL_DTYPES, run_triton_on_cpu, takes_reference


def _reference_fwd(x: torch.Tensor) -> torch.Tensor:
    raw.validate(x, reference=True)
    record_reference("softmax")
    return reference.softmax(x)


def _reference_bwd(dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    raw.validate_bwd(dy, y, reference=True)
    record_reference("softmax_bwd")
    return reference.softmax_bwd(dy, y)


@triton_op("greta::softmax_fwd", mutates_args=())
def softmax_fwd(x: torch.Tensor) -> torch.Tensor:
    if takes_reference(x):
        return _reference_fwd(x)
    return raw.softmax(x, wrap=wrap_triton)


@softmax_fwd.register_kernel("cpu")
def _softmax_cpu(x: torch.Tensor) -> torch.Tensor:
    if run_triton_on_cpu(x):
        return raw.softmax(x)
    return _reference_fwd(x)


@triton_op("greta::softmax_bwd", mutates_args=())
def softmax_bwd(dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if takes_reference(y):
        return _reference_bwd(dy, y)
    return raw.softmax_bwd(dy, y, wrap=wrap_triton)


@softmax_bwd.register_kernel("cpu")
def _softmax_bwd_cpu(dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if run_triton_on_cpu(dy, y):
        return raw.softmax_bwd(dy, y)
    return _reference_bwd(dy, y)


def _setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    ctx.save_for_backward(output)


def _backward(ctx: Any, dy: torch.Tensor) -> torch.Tensor:
    (y,) = ctx.saved_tensors
    return torch.ops.greta.softmax_bwd(dy.contiguous(), y)


softmax_fwd.register_autograd(_backward, setup_context=_setup_context)

_lib = torch.library.Library("greta", "FRAGMENT")
_lib.define("softmax(Tensor x) -> Tensor")


def _softmax(x: torch.Tensor) -> torch.Tensor:
    if x.dtype in KERNEL_DTYPES:
        # Plain GPU tensors, no gradient, no tracing or mode (ops._calls.eager_raw): the
        # plan's ready launch, without a second dispatcher hop and the custom-op autograd
        # layer. Autograd, torch.compile and fake tensors take softmax_fwd.
        y = raw.softmax_if_eager(x)
        if y is not None:
            return y
    return torch.ops.greta.softmax_fwd(x)


# CompositeImplicitAutograd: decomposes into softmax_fwd (autograd, compile, fake follow).
_lib.impl("softmax", _softmax, "CompositeImplicitAutograd")
