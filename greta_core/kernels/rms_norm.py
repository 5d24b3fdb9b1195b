"""RMSNorm over the last dim: y = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps).

fp32 math for every input dtype. Forward also writes rstd (fp32, one per row) for the
backward; with STORE_RSTD off (a call no backward follows) it does not, and rstd_ptr is
never read (the plan passes y's pointer), so the call allocates one buffer, not two. ONE_PASS keeps the whole row in registers (one read, one write per element);
otherwise the row is processed in BLOCK_N chunks (two reads). The backward writes dx and
one fp32 partial row of dweight per program; ``col_sum`` adds the partials, or with
REDUCE_LAST the backward's last program does (one launch: ``_rows._reduce_last``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from greta_core.kernels._rows import load_f32, norm_bwd_rows, row_start, rstd_of


@triton.jit
def _normed_input(x_row, r_row, s_row, cols, mask, ADD: tl.constexpr):
    """The fp32 row the norm is taken of: x, or with ADD s = x + residual as stored (rounded
    to s's dtype, and written to s_row)."""
    v = load_f32(x_row + cols, mask)
    if ADD:
        s = (v + load_f32(r_row + cols, mask)).to(s_row.dtype.element_ty)
        tl.store(s_row + cols, s, mask=mask)
        v = s.to(tl.float32)
    return v


@triton.jit
def rms_norm_fwd_row(
    x_row, r_row, s_row, w_ptr, y_row, n_cols, eps,
    BLOCK_N: tl.constexpr, ONE_PASS: tl.constexpr, ADD: tl.constexpr,
):  # fmt: skip
    """y_row = v * rstd * weight of one row, v = x (ADD off: r_row and s_row are unread) or
    s = x + residual (ADD, shared with add_rms_norm); returns rstd."""
    if ONE_PASS:
        cols = tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        v = _normed_input(x_row, r_row, s_row, cols, mask, ADD)
        rstd = rstd_of(v * v, n_cols, eps)
        w = load_f32(w_ptr + cols, mask)
        tl.store(y_row + cols, (v * rstd * w).to(y_row.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            v = _normed_input(x_row, r_row, s_row, cols, cols < n_cols, ADD)
            acc += v * v
        rstd = rstd_of(acc, n_cols, eps)
        # The second pass reads x again, or s as stored: same offsets and layout as its
        # store, so each thread reads what it wrote.
        if ADD:  # noqa: SIM108  (constexpr branch in a Triton kernel)
            v_row = s_row
        else:
            v_row = x_row
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = cols < n_cols
            v = load_f32(v_row + cols, mask)
            w = load_f32(w_ptr + cols, mask)
            tl.store(y_row + cols, (v * rstd * w).to(y_row.dtype.element_ty), mask=mask)
    return rstd


@triton.jit
def rms_norm_fwd_kernel(
    x_ptr,
    w_ptr,
    n_cols,
    stride_x,
    eps,
    y_ptr,
    rstd_ptr,
    BLOCK_N: tl.constexpr,
    ONE_PASS: tl.constexpr,
    STORE_RSTD: tl.constexpr,
):
    row, x_row, y_row = row_start(x_ptr, stride_x, y_ptr, n_cols)
    rstd = rms_norm_fwd_row(
        x_row, x_row, x_row, w_ptr, y_row, n_cols, eps, BLOCK_N, ONE_PASS, False
    )
    if STORE_RSTD:
        tl.store(rstd_ptr + row, rstd)


@triton.jit
def rms_norm_bwd_kernel(
    dy_ptr,
    x_ptr,
    w_ptr,
    rstd_ptr,
    n_rows,
    n_cols,
    stride_dy,
    stride_x,
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
    # mean_ptr, ds_ptr and db_partial_ptr are unread (CENTER and HAS_DS off); dw_ptr and
    # counter_ptr too without REDUCE_LAST (the plan then passes inputs: see norm_bwd_plan).
    norm_bwd_rows(
        dy_ptr, x_ptr, w_ptr, rstd_ptr, rstd_ptr, dy_ptr, n_rows, n_cols, stride_dy, stride_x, 0,
        dx_ptr, dw_partial_ptr, dw_partial_ptr, dw_ptr, dw_ptr, counter_ptr, BLOCK_N, ONE_PASS,
        False, False, REDUCE_LAST, BLOCK_R, BLOCK_P,
        WAIT_STORES,
    )  # fmt: skip
