"""greta::matmul (user op) over the triton_op greta::matmul_fwd (autograd, compile).

The user op is CompositeImplicitAutograd: its eager hot path launches the plan directly
(see ops/_calls.py); everything else takes matmul_fwd, so compiled graphs keep the kernel.
Both gradients are GEMMs through greta::matmul."""

from __future__ import annotations

import torch
from torch.library import triton_op, wrap_triton

from greta_core import reference
from greta_core.ops import matmul as raw
from greta_core.torch._common import record_reference, use_interpreter_on_cpu
from greta_core.torch._norms_common import takes_reference


def _reference(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    raw.check_shapes(a, b, bias)
    record_reference("matmul")
    return reference.matmul(a, b, bias)


_KERNEL_DTYPES = (torch.float16, torch.bfloat16)


@triton_op("greta::matmul_fwd", mutates_args=())
def matmul_fwd(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    if takes_reference(a, _KERNEL_DTYPES):
        # Traced (torch.compile / opcheck) on CPU: the reference decomposes cleanly; fp32/fp64
        # take it on every device (one dtype rule).
        return _reference(a, b, bias)
    return raw.matmul(a, b, bias, wrap=wrap_triton)


@matmul_fwd.register_kernel("cpu")
def _matmul_cpu(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    # fp32/fp64 (e.g. gradcheck) have no Triton kernel: they always take the reference.
    if use_interpreter_on_cpu() and a.dtype in _KERNEL_DTYPES:
        return raw.matmul(a, b, bias)
    return _reference(a, b, bias)


def _setup_context(ctx: object, inputs: tuple, output: torch.Tensor) -> None:
    a, b, bias = inputs
    ctx.save_for_backward(a, b)  # type: ignore[attr-defined]
    ctx.has_bias = bias is not None  # type: ignore[attr-defined]


def _backward(
    ctx: object, grad: torch.Tensor
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    # Both gradients are GEMMs through the same op, so compiled graphs keep the kernel.
    a, b = ctx.saved_tensors  # type: ignore[attr-defined]
    needs = ctx.needs_input_grad  # type: ignore[attr-defined]
    grad_a = torch.ops.greta.matmul(grad, b.t()) if needs[0] else None
    grad_b = torch.ops.greta.matmul(a.t(), grad) if needs[1] else None
    grad_bias = None
    if ctx.has_bias and needs[2]:  # type: ignore[attr-defined]
        grad_bias = grad.sum(0, dtype=reference.acc_dtype(grad.dtype)).to(grad.dtype)
    return grad_a, grad_b, grad_bias


matmul_fwd.register_autograd(_backward, setup_context=_setup_context)

_lib = torch.library.Library("greta", "FRAGMENT")
_lib.define("matmul(Tensor a, Tensor b, Tensor? bias=None) -> Tensor")


def _matmul(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    if a.dtype in _KERNEL_DTYPES:
        # Plain GPU tensors, no gradient, no tracing or mode (ops._calls.eager_raw): the
        # plan's ready launch, without a second dispatcher hop and the custom-op autograd
        # layer (an eager backward's GEMMs too). Autograd, torch.compile and fake tensors
        # take matmul_fwd.
        out = raw.matmul_if_eager(a, b, bias)
        if out is not None:
            return out
    return torch.ops.greta.matmul_fwd(a, b, bias)


# CompositeImplicitAutograd: decomposes into matmul_fwd (autograd, compile, fake follow).
_lib.impl("matmul", _matmul, "CompositeImplicitAutograd")
