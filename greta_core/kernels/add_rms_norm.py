"""Residual add fused into RMSNorm: s = x + residual, y = s * rstd(s) * weight.

Writes s (in x's dtype: the new residual stream), y and rstd (fp32, one per row, for the
backward; with STORE_RSTD off, a call no backward follows, rstd_ptr is never read: the plan
passes y's pointer and allocates two buffers, not three). The norm is taken of s as stored (rounded to x's dtype), so the result equals
an unfused ``h = x + residual; rms_norm(h)`` in the same dtype. The backward receives the
gradient of both outputs: ds_total = rms_norm_bwd(dy) + ds, which is also d(residual) and
d(x); dweight comes back as fp32 per-program partial rows that ``col_sum`` adds.
ONE_PASS keeps the row in registers; otherwise the row is processed in BLOCK_N chunks.
"""

from __future__ import annotations

import triton
import triton.language as tl

from greta_core.kernels.rms_norm import rms_norm_bwd_rows


@triton.jit
def add_rms_norm_fwd_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    n_cols,
    stride_x,
    stride_r,
    eps,
    y_ptr,
    s_ptr,
    rstd_ptr,
    BLOCK_N: tl.constexpr,
    ONE_PASS: tl.constexpr,
    STORE_RSTD: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    r_row = res_ptr + row * stride_r
    s_row = s_ptr + row * n_cols
    y_row = y_ptr + row * n_cols
    if ONE_PASS:
        cols = tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        r = tl.load(r_row + cols, mask=mask, other=0.0).to(tl.float32)
        s = (x + r).to(s_ptr.dtype.element_ty)
        tl.store(s_row + cols, s, mask=mask)
        sf = s.to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(sf * sf, axis=0) / n_cols + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_row + cols, (sf * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = cols < n_cols
            x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
            r = tl.load(r_row + cols, mask=mask, other=0.0).to(tl.float32)
            s = (x + r).to(s_ptr.dtype.element_ty)
            tl.store(s_row + cols, s, mask=mask)
            sf = s.to(tl.float32)
            acc += sf * sf
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / n_cols + eps)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = cols < n_cols
            # Same offsets and layout as the store above: each thread reads what it wrote.
            sf = tl.load(s_row + cols, mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(y_row + cols, (sf * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)
    if STORE_RSTD:
        tl.store(rstd_ptr + row, rstd)


@triton.jit
def add_rms_norm_bwd_kernel(
    dy_ptr,
    ds_ptr,
    s_ptr,
    w_ptr,
    rstd_ptr,
    n_rows,
    n_cols,
    stride_dy,
    stride_ds,
    dx_ptr,
    dw_partial_ptr,
    BLOCK_N: tl.constexpr,
    ONE_PASS: tl.constexpr,
):
    # s is stored contiguous (the forward writes it): its row stride is n_cols.
    rms_norm_bwd_rows(
        dy_ptr, s_ptr, w_ptr, rstd_ptr, ds_ptr, n_rows, n_cols, stride_dy, n_cols, stride_ds,
        dx_ptr, dw_partial_ptr, BLOCK_N, ONE_PASS, True,
    )  # fmt: skip
