"""greta::swiglu and greta::geglu (act(gate) * up; user ops, autograd) = the triton_ops
greta::swiglu_fwd / geglu_fwd, whose backwards are the triton_ops greta::swiglu_bwd /
geglu_bwd, so compiled graphs keep both Triton kernels. Inside ``consume_inputs()``
(greta_core.torch._common; apply_greta's MLP) the GPU backward writes the gradients over
gate and up."""

from __future__ import annotations

from typing import Any

import torch
from torch.library import triton_op, wrap_triton

from greta_core import reference
from greta_core.ops import swiglu as raw
from greta_core.torch._common import consuming, record_reference
from greta_core.torch._norms_common import KERNEL_DTYPES, run_triton_on_cpu, takes_reference


def _register(op: str) -> None:
    activation = raw.OPS[op]

    def reference_fwd(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        raw.validate(op, gate, up, reference=True)
        record_reference(op)
        return reference.glu(gate, up, activation)

    def reference_bwd(dy, gate, up):
        raw.validate_bwd(op, dy, gate, up, reference=True)
        record_reference(f"{op}_bwd")
        return reference.glu_bwd(dy, gate, up, activation)

    def fwd(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        if takes_reference(gate):
            return reference_fwd(gate, up)
        return raw.glu(op, gate.contiguous(), up.contiguous(), wrap=wrap_triton)

    def fwd_cpu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        if run_triton_on_cpu(gate, up):
            return raw.glu(op, gate.contiguous(), up.contiguous())
        return reference_fwd(gate, up)

    def bwd(
        dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if takes_reference(gate):
            return reference_bwd(dy, gate, up)
        return raw.glu_bwd(op, dy, gate, up, wrap=wrap_triton)

    def bwd_cpu(dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor):
        if run_triton_on_cpu(dy, gate, up):
            return raw.glu_bwd(op, dy, gate, up)
        return reference_bwd(dy, gate, up)

    def bwd_inplace(dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> None:
        raw.glu_bwd_inplace(op, dy, gate, up, wrap=wrap_triton)

    fwd_op = triton_op(f"greta::{op}_fwd", fwd, mutates_args=())
    fwd_op.register_kernel("cpu")(fwd_cpu)
    bwd_op = triton_op(f"greta::{op}_bwd", bwd, mutates_args=())
    bwd_op.register_kernel("cpu")(bwd_cpu)
    bwd_inplace_op = triton_op(f"greta::{op}_bwd_", bwd_inplace, mutates_args=("gate", "up"))

    def setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
        ctx.save_for_backward(*inputs)
        ctx.consume = consuming()

    def backward(ctx: Any, dy: torch.Tensor):
        gate, up = ctx.saved_tensors
        consume = ctx.consume and gate.device.type != "cpu" and not takes_reference(gate)
        if consume and gate.is_contiguous() and up.is_contiguous():
            # The Triton path writes dgate over gate and dup over up, as Liger-Kernel does:
            # two fewer [tokens, intermediate] tensors at the backward's peak (0.25 GiB for a
            # 1B Llama at 8k tokens). A second backward through a retained graph then fails
            # autograd's version check instead of reading the overwritten inputs.
            if torch.compiler.is_compiling():
                bwd_inplace_op(dy.contiguous(), gate, up)
            else:
                # Eager: the launch itself. Through the triton_op, torch 2.15's functional
                # wrap_triton copies the arguments it mutates (GPU suite, locked stack: the
                # consuming backward's peak equalled the copying one's).
                raw.glu_bwd_inplace(op, dy.contiguous(), gate, up)
            return gate, up
        return bwd_op(dy.contiguous(), gate.contiguous(), up.contiguous())

    fwd_op.register_autograd(backward, setup_context=setup_context)

    def user_op(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        if gate.dtype in KERNEL_DTYPES:
            # Plain GPU tensors, no gradient, no tracing (a decode step): the plan launches
            # without the custom-op dispatch; autograd and torch.compile take the triton_op.
            y = raw.glu_if_eager(op, gate, up)
            if y is not None:
                return y
        return fwd_op(gate, up)

    _lib.define(f"{op}(Tensor gate, Tensor up) -> Tensor")
    # CompositeImplicitAutograd: decomposes into the triton_op (autograd, compile, fake).
    _lib.impl(op, user_op, "CompositeImplicitAutograd")


_lib = torch.library.Library("greta", "FRAGMENT")
for _op in raw.OPS:
    _register(_op)
