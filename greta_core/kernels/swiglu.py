"""Gated activations of an MLP: y = act(gate) * up, elementwise over contiguous tensors.

ACT selects the activation (an int constexpr, index into ``ACTIVATIONS``): 0 "silu" (SwiGLU:
Llama, Mistral, Qwen) or 1 "gelu_tanh" (GeGLU with the tanh-approximated GELU: Gemma). fp32 math for every input dtype. The backward writes
both gradients in one pass, recomputing act(gate) instead of saving it (one tensor less
kept for the backward).
"""

from __future__ import annotations

import triton
import triton.language as tl

ACTIVATIONS = ("silu", "gelu_tanh")


@triton.jit
def _act_and_grad(g, ACT: tl.constexpr):
    """(act(g), d act / d g) in fp32."""
    if ACT == 0:
        sig = tl.sigmoid(g)
        act = g * sig
        dact = sig * (1.0 + g * (1.0 - sig))
    else:
        # tanh-approximated GELU: z = sqrt(2/pi) (g + 0.044715 g^3).
        z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        # tanh(z) = 2 sigmoid(2z) - 1: portable (no libdevice tanh on every backend).
        t = 2.0 * tl.sigmoid(2.0 * z) - 1.0
        act = 0.5 * g * (1.0 + t)
        dz = 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * g * g)
        dact = 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * dz
    return act, dact


@triton.jit
def _block(gate_ptr, up_ptr, n_elements, BLOCK: tl.constexpr):
    """This program's (offsets, mask, gate, up), gate and up in fp32."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    g = tl.load(gate_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    return offs, mask, g, u


@triton.jit
def glu_fwd_kernel(
    gate_ptr,
    up_ptr,
    n_elements,
    y_ptr,
    ACT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs, mask, g, u = _block(gate_ptr, up_ptr, n_elements, BLOCK)
    act, _ = _act_and_grad(g, ACT)
    tl.store(y_ptr + offs, (act * u).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def glu_bwd_kernel(
    dy_ptr,
    gate_ptr,
    up_ptr,
    n_elements,
    dgate_ptr,
    dup_ptr,
    ACT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs, mask, g, u = _block(gate_ptr, up_ptr, n_elements, BLOCK)
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    act, dact = _act_and_grad(g, ACT)
    tl.store(dgate_ptr + offs, (dy * u * dact).to(dgate_ptr.dtype.element_ty), mask=mask)
    tl.store(dup_ptr + offs, (dy * act).to(dup_ptr.dtype.element_ty), mask=mask)
