"""Rotary position embedding, rotate-half convention, token-major layout.

x: [batch, seq, heads, head_dim] (any strides), out contiguous. With x1 = x[..., :d/2],
x2 = x[..., d/2:]: out1 = x1*cos - x2*sin, out2 = x2*cos + x1*sin. INVERSE rotates by the
negative angle (the backward). One program per (token, block of heads): cos/sin are read
once per token and reused across heads.

``rope_kernel`` reads cos/sin ([seq, d/2] or [batch, seq, d/2]: stride_cb = 0 broadcasts);
``rope_positions_kernel`` computes them from integer positions ([seq] or [batch, seq]) and
log2(theta): angle_i = pos * theta^(-2i/d), in fp32.

The AOT specs are derived from the declarations' plans (``greta_core/ops/rope.py``).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _token(seq_len, BLOCK_HALF: tl.constexpr):
    """(batch, position) of this program's token, and the lanes of half a head."""
    token = tl.program_id(0).to(tl.int64)
    return token // seq_len, token % seq_len, tl.arange(0, BLOCK_HALF)


@triton.jit
def _rotate_store(
    x_ptr, out_ptr, b, s, n_heads, half, cos, sin,
    stride_xb, stride_xs, stride_xh, stride_xd,
    stride_ob, stride_os, stride_oh,
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, INVERSE: tl.constexpr,
):  # fmt: skip
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_HALF)
    mask = (heads[:, None] < n_heads) & (dims[None, :] < half)
    x_base = x_ptr + b * stride_xb + s * stride_xs + heads[:, None] * stride_xh
    x1 = tl.load(x_base + dims[None, :] * stride_xd, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_base + (dims[None, :] + half) * stride_xd, mask=mask, other=0.0)
    x2 = x2.to(tl.float32)
    c = cos[None, :]
    sn = sin[None, :]
    if INVERSE:
        sn = -sn
    o_base = out_ptr + b * stride_ob + s * stride_os + heads[:, None] * stride_oh
    out_ty = out_ptr.dtype.element_ty
    tl.store(o_base + dims[None, :], (x1 * c - x2 * sn).to(out_ty), mask=mask)
    tl.store(o_base + half + dims[None, :], (x2 * c + x1 * sn).to(out_ty), mask=mask)


@triton.jit
def rope_kernel(
    x_ptr, cos_ptr, sin_ptr,
    seq_len, n_heads, half,
    stride_xb, stride_xs, stride_xh, stride_xd,
    stride_cb, stride_cs,
    stride_ob, stride_os, stride_oh,
    out_ptr,
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, INVERSE: tl.constexpr,
):  # fmt: skip
    b, s, dims = _token(seq_len, BLOCK_HALF)
    cs_off = b * stride_cb + s * stride_cs + dims
    cos = tl.load(cos_ptr + cs_off, mask=dims < half, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + cs_off, mask=dims < half, other=0.0).to(tl.float32)
    _rotate_store(
        x_ptr, out_ptr, b, s, n_heads, half, cos, sin,
        stride_xb, stride_xs, stride_xh, stride_xd, stride_ob, stride_os, stride_oh,
        BLOCK_H, BLOCK_HALF, INVERSE,
    )  # fmt: skip


@triton.jit
def rope_positions_kernel(
    x_ptr, pos_ptr,
    seq_len, n_heads, half,
    stride_xb, stride_xs, stride_xh, stride_xd,
    stride_pb, stride_ps,
    log2_theta,
    stride_ob, stride_os, stride_oh,
    out_ptr,
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, INVERSE: tl.constexpr,
):  # fmt: skip
    b, s, dims = _token(seq_len, BLOCK_HALF)
    pos = tl.load(pos_ptr + b * stride_pb + s * stride_ps).to(tl.float32)
    inv_freq = tl.exp2(-(dims.to(tl.float32) * 2.0 / (2 * half)) * log2_theta)
    angle = pos * inv_freq
    _rotate_store(
        x_ptr, out_ptr, b, s, n_heads, half, tl.cos(angle), tl.sin(angle),
        stride_xb, stride_xs, stride_xh, stride_xd, stride_ob, stride_os, stride_oh,
        BLOCK_H, BLOCK_HALF, INVERSE,
    )  # fmt: skip
