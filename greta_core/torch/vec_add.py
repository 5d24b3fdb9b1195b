from __future__ import annotations

import torch
from torch.library import triton_op, wrap_triton

from greta_core.ops import vec_add as raw
from greta_core.ops._validate import check_same_shape, check_tensor
from greta_core.torch._common import record_reference, use_interpreter_on_cpu


def _reference(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    check_tensor("vec_add", "x", x)
    check_tensor("vec_add", "y", y, dtypes=(x.dtype,))
    check_same_shape("vec_add", x=x, y=y)
    record_reference("vec_add")
    return x + y


@triton_op("greta::vec_add", mutates_args=())
def vec_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if x.device.type == "cpu":
        # Traced (torch.compile / opcheck) on CPU: the reference decomposes cleanly.
        return _reference(x, y)
    arch = raw.validate(x, y)
    out = torch.empty_like(x)
    raw.launch(x, y, out, arch, wrap=wrap_triton)
    return out


@vec_add.register_kernel("cpu")
def _vec_add_cpu(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if use_interpreter_on_cpu():
        return raw.vec_add(x, y)
    return _reference(x, y)


def _backward(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return grad, grad


vec_add.register_autograd(_backward)
