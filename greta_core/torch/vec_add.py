"""greta::vec_add (user op) over the triton_op greta::vec_add_fwd (autograd, compile).

The user op is CompositeImplicitAutograd: its eager hot path launches the plan directly
(see ops/_calls.py); everything else takes vec_add_fwd, so compiled graphs keep the kernel."""

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


@triton_op("greta::vec_add_fwd", mutates_args=())
def vec_add_fwd(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if x.device.type in ("cpu", "meta"):
        # Traced (torch.compile / opcheck) on CPU: the reference decomposes cleanly; on meta
        # tensors it gives the result's shape and dtype (a launch would read their data).
        return _reference(x, y)
    return raw.vec_add(x, y, wrap=wrap_triton)


@vec_add_fwd.register_kernel("cpu")
def _vec_add_cpu(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if use_interpreter_on_cpu():
        return raw.vec_add(x, y)
    return _reference(x, y)


def _backward(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return grad, grad


vec_add_fwd.register_autograd(_backward)

_lib = torch.library.Library("greta", "FRAGMENT")
_lib.define("vec_add(Tensor x, Tensor y) -> Tensor")


def _vec_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    # Plain GPU tensors, no gradient, no tracing or mode (ops._calls.eager_raw): the plan's
    # ready launch, without a second dispatcher hop and the custom-op autograd layer.
    # Autograd, torch.compile and fake tensors take vec_add_fwd. Every dtype the triton_op
    # launches on a GPU goes here too: its GPU body is the same raw call.
    out = raw.vec_add_if_eager(x, y)
    if out is not None:
        return out
    return torch.ops.greta.vec_add_fwd(x, y)


# CompositeImplicitAutograd: decomposes into vec_add_fwd (autograd, compile, fake follow).
_lib.impl("vec_add", _vec_add, "CompositeImplicitAutograd")
