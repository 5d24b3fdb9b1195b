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


@triton_op("greta::matmul", mutates_args=())
def matmul(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    if takes_reference(a, (torch.float16, torch.bfloat16)):
        # Traced (torch.compile / opcheck) on CPU: the reference decomposes cleanly; fp32/fp64
        # take it on every device (one dtype rule).
        return _reference(a, b, bias)
    return raw.matmul(a, b, bias, wrap=wrap_triton)


@matmul.register_kernel("cpu")
def _matmul_cpu(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    # fp32/fp64 (e.g. gradcheck) have no Triton kernel: they always take the reference.
    if use_interpreter_on_cpu() and a.dtype in (torch.float16, torch.bfloat16):
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


matmul.register_autograd(_backward, setup_context=_setup_context)
