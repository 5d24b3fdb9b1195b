"""``@triton.jit`` helpers of the row kernels (the norms, softmax): Triton inlines them.

Private (a ``_`` module): no ``aot_specs`` of its own; the kernels that call these carry them.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def row_start(x_ptr, stride_x, y_ptr, n_cols):
    """This program's row: (its int64 index, its input row, stride_x apart, its output row of
    a contiguous [rows, n_cols] result)."""
    row = tl.program_id(0).to(tl.int64)
    return row, x_ptr + row * stride_x, y_ptr + row * n_cols


@triton.jit
def load_f32(ptrs, mask):
    """A masked load (zeros outside the mask) in fp32: the row kernels' math type."""
    return tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def rstd_of(squares, n_cols, eps):
    """1 / sqrt(mean + eps) of a row from its lanes' sums of squares."""
    return 1.0 / tl.sqrt(tl.sum(squares, axis=0) / n_cols + eps)


@triton.jit
def _xhat(x, mean, rstd, mask, CENTER: tl.constexpr):
    """The normalised row: (x - mean) * rstd (zero outside the row) with CENTER, else x * rstd."""
    if CENTER:  # noqa: SIM108  (constexpr branch in a Triton kernel)
        xhat = tl.where(mask, (x - mean) * rstd, 0.0)
    else:
        xhat = x * rstd
    return xhat


@triton.jit
def _stats(mean_ptr, rstd_ptr, row, CENTER: tl.constexpr):
    """(mean, rstd) of a row; the mean is 0 without CENTER (RMSNorm saves none)."""
    mean = 0.0
    if CENTER:
        mean = tl.load(mean_ptr + row)
    return mean, tl.load(rstd_ptr + row)


@triton.jit
def norm_bwd_rows(
    dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, ds_ptr,
    n_rows, n_cols, stride_dy, stride_x, stride_ds,
    dx_ptr, dw_partial_ptr, db_partial_ptr,
    BLOCK_N: tl.constexpr, ONE_PASS: tl.constexpr, CENTER: tl.constexpr, HAS_DS: tl.constexpr,
):  # fmt: skip
    """The backward of this program's rows of a norm, g = w * dy:
    RMSNorm (CENTER off): dx = rstd * (g - xhat * mean(g * xhat)), xhat = x * rstd;
    LayerNorm (CENTER): dx = rstd * (g - xhat * mean(g * xhat) - mean(g)), xhat = (x - mean)
    * rstd, and the bias partials (mean_ptr / db_partial_ptr are unread without CENTER).
    HAS_DS: the gradient `ds` reaching the normed input directly is added to dx (add_rms_norm;
    ds_ptr is unread without). Writes one fp32 partial row of dweight (and dbias) per
    program; ``col_sum`` adds them."""
    pid = tl.program_id(0)
    n_progs = tl.num_programs(0)
    dw_row = dw_partial_ptr + pid.to(tl.int64) * n_cols
    db_row = db_partial_ptr + pid.to(tl.int64) * n_cols
    if ONE_PASS:
        cols = tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        w = load_f32(w_ptr + cols, mask)
        dw_acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        db_acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for row in range(pid, n_rows, n_progs):
            row64 = tl.cast(row, tl.int64)
            x = load_f32(x_ptr + row64 * stride_x + cols, mask)
            dy = load_f32(dy_ptr + row64 * stride_dy + cols, mask)
            mean, rstd = _stats(mean_ptr, rstd_ptr, row64, CENTER)
            xhat = _xhat(x, mean, rstd, mask, CENTER)
            g = w * dy
            dx = g - xhat * (tl.sum(g * xhat, axis=0) / n_cols)
            if CENTER:
                dx -= tl.sum(g, axis=0) / n_cols
                db_acc += dy
            dx = dx * rstd
            if HAS_DS:
                dx += load_f32(ds_ptr + row64 * stride_ds + cols, mask)
            tl.store(dx_ptr + row64 * n_cols + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
            dw_acc += dy * xhat
        tl.store(dw_row + cols, dw_acc, mask=mask)
        if CENTER:
            tl.store(db_row + cols, db_acc, mask=mask)
    else:
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            zero = tl.zeros((BLOCK_N,), dtype=tl.float32)
            tl.store(dw_row + cols, zero, mask=cols < n_cols)
            if CENTER:
                tl.store(db_row + cols, zero, mask=cols < n_cols)
        for row in range(pid, n_rows, n_progs):
            row64 = tl.cast(row, tl.int64)
            mean, rstd = _stats(mean_ptr, rstd_ptr, row64, CENTER)
            acc1 = tl.zeros((BLOCK_N,), dtype=tl.float32)
            acc2 = tl.zeros((BLOCK_N,), dtype=tl.float32)
            for start in range(0, n_cols, BLOCK_N):
                cols = start + tl.arange(0, BLOCK_N)
                mask = cols < n_cols
                x = load_f32(x_ptr + row64 * stride_x + cols, mask)
                dy = load_f32(dy_ptr + row64 * stride_dy + cols, mask)
                g = load_f32(w_ptr + cols, mask) * dy
                if CENTER:
                    acc1 += g * _xhat(x, mean, rstd, mask, CENTER)
                    acc2 += g
                else:
                    acc1 += g * x  # rstd applied once to the sum
            if CENTER:
                c1 = tl.sum(acc1, axis=0) / n_cols
                c2 = tl.sum(acc2, axis=0) / n_cols
            else:
                c1 = tl.sum(acc1, axis=0) * rstd / n_cols
            for start in range(0, n_cols, BLOCK_N):
                cols = start + tl.arange(0, BLOCK_N)
                mask = cols < n_cols
                x = load_f32(x_ptr + row64 * stride_x + cols, mask)
                dy = load_f32(dy_ptr + row64 * stride_dy + cols, mask)
                xhat = _xhat(x, mean, rstd, mask, CENTER)
                dx = load_f32(w_ptr + cols, mask) * dy - xhat * c1
                if CENTER:
                    dx -= c2
                dx = dx * rstd
                if HAS_DS:
                    dx += load_f32(ds_ptr + row64 * stride_ds + cols, mask)
                tl.store(dx_ptr + row64 * n_cols + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
                # Same offsets, shape and layout as the zeroing stores: each thread reads back
                # only what it wrote, so no barrier is needed.
                part = tl.load(dw_row + cols, mask=mask, other=0.0)
                tl.store(dw_row + cols, part + dy * xhat, mask=mask)
                if CENTER:
                    part = tl.load(db_row + cols, mask=mask, other=0.0)
                    tl.store(db_row + cols, part + dy, mask=mask)
