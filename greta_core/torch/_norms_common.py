"""Helpers shared by the norm/softmax torch op modules."""

from __future__ import annotations

import torch

from greta_core.torch._common import use_interpreter_on_cpu

KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def run_triton_on_cpu(*tensors: torch.Tensor | None) -> bool:
    """CPU tensors take the Triton interpreter only under TRITON_INTERPRET=1 and for the
    kernel dtypes; float64 (gradcheck) always takes the reference."""
    return use_interpreter_on_cpu() and all(
        t is None or not t.is_floating_point() or t.dtype in KERNEL_DTYPES for t in tensors
    )


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def takes_reference(
    t: torch.Tensor, kernel_dtypes: tuple[torch.dtype, ...] = KERNEL_DTYPES
) -> bool:
    """True when a triton_op body runs the torch reference: CPU tensors (and tracing on the
    CPU), and dtypes the kernels do not take on any device (float64 for gradcheck; the
    reference's validation rejects int/bool), so CPU and GPU share one dtype rule. Meta
    tensors take it too: the reference is torch ops, which give a meta result of the right
    shape and dtype, where a launch would try to copy data a meta tensor does not have."""
    return t.device.type in ("cpu", "meta") or t.dtype not in kernel_dtypes
