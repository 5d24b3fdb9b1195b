"""Residual add fused into RMSNorm: s = x + residual, y = s * rstd(s) * weight.

Writes s (in x's dtype: the new residual stream), y and rstd (fp32, one per row, for the
backward; with STORE_RSTD off, a call no backward follows, rstd_ptr is never read: the plan
passes y's pointer and allocates two buffers, not three). The norm is taken of s as stored (rounded to x's dtype), so the result equals
an unfused ``h = x + residual; rms_norm(h)`` in the same dtype. The backward receives the
gradient of both outputs: ds_total = rms_norm_bwd(dy) + ds, which is also d(residual) and
d(x); dweight comes back as fp32 per-program partial rows that ``col_sum`` adds (or, with
REDUCE_LAST, the backward's last program: one launch).
ONE_PASS keeps the row in registers; otherwise the row is processed in BLOCK_N chunks.
"""

from __future__ import annotations

import triton
import triton.language as tl

from greta_core.kernels._rows import norm_bwd_rows, row_start
from greta_core.kernels.rms_norm import rms_norm_fwd_row


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
    row, x_row, y_row = row_start(x_ptr, stride_x, y_ptr, n_cols)
    rstd = rms_norm_fwd_row(
        x_row, res_ptr + row * stride_r, s_ptr + row * n_cols, w_ptr, y_row, n_cols, eps,
        BLOCK_N, ONE_PASS, True,
    )  # fmt: skip
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
    dw_ptr,
    counter_ptr,
    dx_ptr,
    dw_partial_ptr,
    BLOCK_N: tl.constexpr,
    ONE_PASS: tl.constexpr,
    REDUCE_LAST: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_P: tl.constexpr,
    WAIT_STORES: tl.constexpr,
):
    # s is stored contiguous (the forward writes it): its row stride is n_cols. dw_ptr and
    # counter_ptr are unread without REDUCE_LAST.
    norm_bwd_rows(
        dy_ptr, s_ptr, w_ptr, rstd_ptr, rstd_ptr, ds_ptr, n_rows, n_cols, stride_dy, n_cols,
        stride_ds, dx_ptr, dw_partial_ptr, dw_partial_ptr, dw_ptr, dw_ptr, counter_ptr,
        BLOCK_N, ONE_PASS, False, True, REDUCE_LAST, BLOCK_R, BLOCK_P,
        WAIT_STORES,
    )  # fmt: skip
