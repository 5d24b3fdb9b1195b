"""greta::softmax over the last dim (autograd: the triton_op greta::softmax_bwd)."""

from __future__ import annotations

from typing import Any

import torch
from torch.library import triton_op, wrap_triton

from greta_core import reference
from greta_core.ops import softmax as raw
from greta_core.torch._common import record_reference
from greta_core.torch._norms_common import run_triton_on_cpu, takes_reference


def _reference_fwd(x: torch.Tensor) -> torch.Tensor:
    raw.validate(x, reference=True)
    record_reference("softmax")
    return reference.softmax(x)


def _reference_bwd(dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    raw.validate_bwd(dy, y, reference=True)
    record_reference("softmax_bwd")
    return reference.softmax_bwd(dy, y)


@triton_op("greta::softmax", mutates_args=())
def softmax(x: torch.Tensor) -> torch.Tensor:
    if takes_reference(x):
        return _reference_fwd(x)
    return raw.softmax(x, wrap=wrap_triton)


@softmax.register_kernel("cpu")
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


softmax.register_autograd(_backward, setup_context=_setup_context)
