"""Numerically stable softmax over the last dim, forward and backward.

ONE_PASS keeps the row in registers (one read, one write per element). Longer rows use
an online pass (running per-lane max and rescaled sum, Milakov & Gimelshein 2018) then a
write pass: two reads, one write. Backward: dx = y * (dy - sum(y * dy)). fp32 math.
"""

from __future__ import annotations

import triton
import triton.language as tl

from greta_core.kernels._rows import load_f32, row_start


@triton.jit
def softmax_fwd_kernel(
    x_ptr,
    n_cols,
    stride_x,
    y_ptr,
    BLOCK_N: tl.constexpr,
    ONE_PASS: tl.constexpr,
):
    _, x_row, y_row = row_start(x_ptr, stride_x, y_ptr, n_cols)
    if ONE_PASS:
        cols = tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=-float("inf")).to(tl.float32)
        m = tl.max(x, axis=0)
        e = tl.exp2((x - m) * 1.4426950408889634)
        y = e / tl.sum(e, axis=0)
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        m_vec = tl.full((BLOCK_N,), -float("inf"), dtype=tl.float32)
        s_vec = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            x = tl.load(x_row + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
            m_new = tl.maximum(m_vec, x)
            # A lane that has seen only -inf keeps m = -inf: avoid (-inf) - (-inf) = NaN.
            safe = tl.where(m_new == -float("inf"), 0.0, m_new)
            s_vec = s_vec * tl.exp2((m_vec - safe) * 1.4426950408889634) + tl.exp2(
                (x - safe) * 1.4426950408889634
            )
            m_vec = m_new
        m = tl.max(m_vec, axis=0)
        s = tl.sum(s_vec * tl.exp2((m_vec - m) * 1.4426950408889634), axis=0)
        inv = 1.0 / s
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = cols < n_cols
            x = tl.load(x_row + cols, mask=mask, other=-float("inf")).to(tl.float32)
            y = tl.exp2((x - m) * 1.4426950408889634) * inv
            tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def softmax_bwd_kernel(
    dy_ptr,
    y_ptr,
    n_cols,
    stride_dy,
    stride_y,
    dx_ptr,
    BLOCK_N: tl.constexpr,
    ONE_PASS: tl.constexpr,
):
    row, dy_row, dx_row = row_start(dy_ptr, stride_dy, dx_ptr, n_cols)
    y_row = y_ptr + row * stride_y
    if ONE_PASS:
        cols = tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        dy = load_f32(dy_row + cols, mask)
        y = load_f32(y_row + cols, mask)
        dot = tl.sum(y * dy, axis=0)
        tl.store(dx_row + cols, (y * (dy - dot)).to(dx_ptr.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = cols < n_cols
            dy = load_f32(dy_row + cols, mask)
            y = load_f32(y_row + cols, mask)
            acc += y * dy
        dot = tl.sum(acc, axis=0)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = cols < n_cols
            dy = load_f32(dy_row + cols, mask)
            y = load_f32(y_row + cols, mask)
            tl.store(dx_row + cols, (y * (dy - dot)).to(dx_ptr.dtype.element_ty), mask=mask)
