"""torch.ops.greta.attention (output) and attention_with_lse (output, logsumexp).

The forward runs the Triton kernel and keeps its output and logsumexp for the backward:
``greta::attention`` is ``attention_with_lse(...)[0]``, whose backward is the Triton
FlashAttention-2 backward (``greta::attention_bwd``, O(S) memory, no second forward) for
fp16/bf16 calls without per-batch lengths; with ``q_lens``/``kv_lens`` it is the plain
softmax-attention gradient in torch ops, which materialises the [B, H, Sq, Skv]
probabilities. The logsumexp output is not differentiable.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable
from torch.library import triton_op, wrap_triton

from greta_core import reference as ref
from greta_core.observe import record
from greta_core.ops import attention as raw
from greta_core.ops import attention_bwd as raw_bwd
from greta_core.ops._calls import eager_autograd
from greta_core.torch._common import record_reference, use_interpreter_on_cpu

_TRITON_DTYPES = (torch.float16, torch.bfloat16)


def reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
    scale: float | None = None, q_lens: torch.Tensor | None = None,
    kv_lens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(o in q's dtype, logsumexp fp32 or wider): the kernel's semantics in torch ops."""
    raw.check_shapes(q, k, v, q_lens, kv_lens)
    return ref.attention_with_lse(q, k, v, causal, scale, q_lens, kv_lens)


def _reference_cpu(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None,
    q_lens: torch.Tensor | None, kv_lens: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    record_reference("attention")
    out, lse = reference(q, k, v, causal, scale, q_lens, kv_lens)
    return out, lse.float()


def _forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None,
    q_lens: torch.Tensor | None, kv_lens: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    if q.device.type == "cpu" or q.dtype not in _TRITON_DTYPES:
        # Traced (torch.compile / opcheck) on CPU: the reference decomposes cleanly. fp32/fp64
        # on a GPU take it too: one dtype rule on every device.
        return _reference_cpu(q, k, v, causal, scale, q_lens, kv_lens)
    return raw.attention_with_lse(q, k, v, causal, scale, q_lens, kv_lens, wrap=wrap_triton)


def _forward_cpu(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None,
    q_lens: torch.Tensor | None, kv_lens: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    if use_interpreter_on_cpu() and q.dtype in _TRITON_DTYPES:
        return raw.attention_with_lse(q, k, v, causal, scale, q_lens, kv_lens)
    return _reference_cpu(q, k, v, causal, scale, q_lens, kv_lens)


@triton_op("greta::attention_with_lse", mutates_args=())
def attention_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
    scale: float | None = None, q_lens: torch.Tensor | None = None,
    kv_lens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    return _forward(q, k, v, causal, scale, q_lens, kv_lens)


@attention_with_lse.register_kernel("cpu")
def _attention_with_lse_cpu(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
    scale: float | None = None, q_lens: torch.Tensor | None = None,
    kv_lens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    return _forward_cpu(q, k, v, causal, scale, q_lens, kv_lens)


@triton_op("greta::attention_bwd", mutates_args=())
def attention_bwd(
    grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    lse: torch.Tensor, causal: bool = False, scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(dq, dk, dv) of greta::attention without lengths, from its output and logsumexp."""
    if q.device.type == "cpu":
        return ref.attention_bwd(grad, q, k, v, causal, scale)
    return raw_bwd.attention_bwd(grad, q, k, v, out, lse, causal, scale, wrap=wrap_triton)


@attention_bwd.register_kernel("cpu")
def _attention_bwd_cpu(
    grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    lse: torch.Tensor, causal: bool = False, scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    if use_interpreter_on_cpu() and q.dtype in _TRITON_DTYPES:
        return raw_bwd.attention_bwd(grad, q, k, v, out, lse, causal, scale)
    record_reference("attention_bwd")
    return ref.attention_bwd(grad, q, k, v, causal, scale)


def _setup_context(ctx: object, inputs: tuple, output: tuple) -> None:
    q, k, v, causal, scale, q_lens, kv_lens = inputs
    out, lse = output
    # The forward's output and logsumexp: the backward needs no second forward.
    ctx.save_for_backward(q, k, v, q_lens, kv_lens, out, lse)  # type: ignore[attr-defined]
    ctx.mark_non_differentiable(lse)  # type: ignore[attr-defined]
    ctx.causal = causal  # type: ignore[attr-defined]
    ctx.scale = scale  # type: ignore[attr-defined]


def _backward(ctx: object, grad: torch.Tensor, _dlse: torch.Tensor | None) -> tuple:
    """Triton FlashAttention-2 backward from the saved output and logsumexp; with
    per-batch lengths, or dtypes the kernels do not take, the torch-ops reference."""
    q, k, v, q_lens, kv_lens, out, lse = ctx.saved_tensors  # type: ignore[attr-defined]
    causal, scale = ctx.causal, ctx.scale  # type: ignore[attr-defined]
    if q_lens is None and kv_lens is None and q.dtype in _TRITON_DTYPES:
        grad = grad.contiguous()
        dq, dk, dv = torch.ops.greta.attention_bwd(grad, q, k, v, out, lse, causal, scale)
    else:
        record("attention_bwd", "reference-torch", q.device.type)
        dq, dk, dv = ref.attention_bwd(grad, q, k, v, causal, scale, q_lens, kv_lens)
    return dq, dk, dv, None, None, None, None


attention_with_lse.register_autograd(_backward, setup_context=_setup_context)


class _EagerTraining(torch.autograd.Function):
    """greta::attention in eager training (see ops._calls.eager_autograd): the forward's
    ready launch and the Triton backward, the same kernels and saved tensors as
    attention_with_lse's autograd, without torch.library's per-call wrapper. torch.compile,
    dispatch modes and functorch transforms keep taking attention_with_lse. The forward
    takes ``ctx`` (no ``setup_context``): Function.apply then binds no default arguments
    through ``inspect.signature``, about 100 us of host time per call."""

    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
        scale: float | None,
    ) -> torch.Tensor:  # fmt: skip
        out, lse = raw.attention_with_lse(q, k, v, causal, scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale = causal, scale
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = raw_bwd.attention_bwd(
            grad.contiguous(), q, k, v, out, lse, ctx.causal, ctx.scale
        )
        return dq, dk, dv, None, None


_lib = torch.library.Library("greta", "FRAGMENT")
_lib.define(
    "attention(Tensor q, Tensor k, Tensor v, bool causal=False, float? scale=None, "
    "Tensor? q_lens=None, Tensor? kv_lens=None) -> Tensor"
)


def _attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
    q_lens: torch.Tensor | None = None,
    kv_lens: torch.Tensor | None = None,
) -> torch.Tensor:
    if q.dtype in _TRITON_DTYPES:
        # Plain GPU tensors, no gradient, no tracing or mode (a decode step; the checks of
        # ops._calls.eager_raw): the plan's ready launch, without the custom-op dispatch.
        # torch.compile and dispatch modes take the triton_op.
        out = raw.attention_if_eager(q, k, v, causal, scale, q_lens, kv_lens)
        if out is not None:
            return out
        # Eager training without lengths (their backward is the torch reference): the same
        # kernels as the torch op's autograd, at a fraction of its host cost.
        if q_lens is None and kv_lens is None and eager_autograd(q, k, v):
            return _EagerTraining.apply(q, k, v, causal, scale)
    return torch.ops.greta.attention_with_lse(q, k, v, causal, scale, q_lens, kv_lens)[0]


# CompositeImplicitAutograd: decomposes into attention_with_lse (autograd, compile and fake
# tensors follow), whose saved logsumexp spares the backward a second forward.
_lib.impl("attention", _attention, "CompositeImplicitAutograd")
