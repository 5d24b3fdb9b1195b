"""LayerNorm over the last dim: y = (x - mean) * rstd * weight (+ bias).

fp32 math for every input dtype; forward also writes mean and rstd (fp32, one per row) for
the backward; with STORE_STATS off (a call no backward follows) it does not, and mean_ptr /
rstd_ptr are never read (the plan passes y's pointer): one allocation, not three. ONE_PASS keeps the row in registers (exact two-moment variance from the registers);
otherwise BLOCK_N chunks are read three times (mean, variance, output). HAS_BIAS=False
ignores ``b_ptr`` (callers pass any valid pointer). The backward writes dx and one fp32
partial row of dweight and one of dbias per program, in one [2 * programs, N] buffer
(dweight's rows first); one ``col_sum`` launch adds both (or, with REDUCE_LAST, the
backward's last program: one launch).
"""

from __future__ import annotations

import triton
import triton.language as tl

from greta_core.kernels._rows import load_f32, norm_bwd_rows, row_start, rstd_of


@triton.jit
def layer_norm_fwd_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    n_cols,
    stride_x,
    eps,
    y_ptr,
    mean_ptr,
    rstd_ptr,
    BLOCK_N: tl.constexpr,
    ONE_PASS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    STORE_STATS: tl.constexpr,
):
    row, x_row, y_row = row_start(x_ptr, stride_x, y_ptr, n_cols)
    if ONE_PASS:
        cols = tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        x = load_f32(x_row + cols, mask)
        mean = tl.sum(x, axis=0) / n_cols
        xc = tl.where(mask, x - mean, 0.0)
        rstd = rstd_of(xc * xc, n_cols, eps)
        w = load_f32(w_ptr + cols, mask)
        y = xc * rstd * w
        if HAS_BIAS:
            y += load_f32(b_ptr + cols, mask)
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            acc += load_f32(x_row + cols, cols < n_cols)
        mean = tl.sum(acc, axis=0) / n_cols
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = cols < n_cols
            x = load_f32(x_row + cols, mask)
            xc = tl.where(mask, x - mean, 0.0)
            acc += xc * xc
        rstd = rstd_of(acc, n_cols, eps)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = cols < n_cols
            x = load_f32(x_row + cols, mask)
            w = load_f32(w_ptr + cols, mask)
            y = (x - mean) * rstd * w
            if HAS_BIAS:
                y += load_f32(b_ptr + cols, mask)
            tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
    if STORE_STATS:
        tl.store(mean_ptr + row, mean)
        tl.store(rstd_ptr + row, rstd)


@triton.jit
def layer_norm_bwd_kernel(
    dy_ptr,
    x_ptr,
    w_ptr,
    mean_ptr,
    rstd_ptr,
    n_rows,
    n_cols,
    stride_dy,
    stride_x,
    dw_ptr,
    db_ptr,
    counter_ptr,
    dx_ptr,
    partial_ptr,
    BLOCK_N: tl.constexpr,
    ONE_PASS: tl.constexpr,
    REDUCE_LAST: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_P: tl.constexpr,
    WAIT_STORES: tl.constexpr,
):
    # dx = rstd * (g - xhat * mean(g * xhat) - mean(g)), g = w * dy; ds_ptr is unread. The
    # partials: [2 * programs, N], dweight's rows then dbias's (one buffer, one col_sum, or
    # with REDUCE_LAST the last program's sums into dw_ptr and db_ptr, unread without).
    db_partial_ptr = partial_ptr + tl.num_programs(0).to(tl.int64) * n_cols
    norm_bwd_rows(
        dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dy_ptr, n_rows, n_cols, stride_dy, stride_x, 0,
        dx_ptr, partial_ptr, db_partial_ptr, dw_ptr, db_ptr, counter_ptr, BLOCK_N, ONE_PASS,
        True, False, REDUCE_LAST, BLOCK_R, BLOCK_P,
        WAIT_STORES,
    )  # fmt: skip
