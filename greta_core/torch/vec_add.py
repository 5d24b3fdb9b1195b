from __future__ import annotations

import torch
from torch.library import triton_op, wrap_triton

from greta_core import reference
from greta_core.ops import vec_add as raw
from greta_core.torch._common import record_reference, use_interpreter_on_cpu


def _reference(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    raw.check_inputs(x, y)
    record_reference("vec_add")
    return reference.vec_add(x, y)


@triton_op("greta::vec_add", mutates_args=())
def vec_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if x.device.type == "cpu":
        # Traced (torch.compile / opcheck) on CPU: the reference decomposes cleanly.
        return _reference(x, y)
    return raw.vec_add(x, y, wrap=wrap_triton)


@vec_add.register_kernel("cpu")
def _vec_add_cpu(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if use_interpreter_on_cpu():
        return raw.vec_add(x, y)
    return _reference(x, y)


def _backward(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return grad, grad


vec_add.register_autograd(_backward)
