"""RMSNorm over the last dim: y = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps).

fp32 math for every input dtype. Forward also writes rstd (fp32, one per row) for the
backward; with STORE_RSTD off (a call no backward follows) it does not, and rstd_ptr is
never read (the plan passes y's pointer), so the call allocates one buffer, not two. ONE_PASS keeps the whole row in registers (one read, one write per element);
otherwise the row is processed in BLOCK_N chunks (two reads). The backward writes dx and
one fp32 partial row of dweight per program; ``col_sum`` adds the partials.
"""

from __future__ import annotations

import triton
import triton.language as tl


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
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    y_row = y_ptr + row * n_cols
    if ONE_PASS:
        cols = tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_row + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            x = tl.load(x_row + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
            acc += x * x
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / n_cols + eps)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = cols < n_cols
            x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(y_row + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)
    if STORE_RSTD:
        tl.store(rstd_ptr + row, rstd)


@triton.jit
def rms_norm_bwd_rows(
    dy_ptr,
    x_ptr,
    w_ptr,
    rstd_ptr,
    ds_ptr,
    n_rows,
    n_cols,
    stride_dy,
    stride_x,
    stride_ds,
    dx_ptr,
    dw_partial_ptr,
    BLOCK_N: tl.constexpr,
    ONE_PASS: tl.constexpr,
    HAS_DS: tl.constexpr,
):
    """The RMSNorm backward of this program's rows, shared with add_rms_norm (HAS_DS: the
    gradient `ds` reaching x + residual directly is added to dx; ds_ptr is unread without).
    dx = rstd * (g - xhat * mean(g * xhat)) (+ ds), g = w * dy, xhat = x * rstd."""
    pid = tl.program_id(0)
    n_progs = tl.num_programs(0)
    partial_row = dw_partial_ptr + pid.to(tl.int64) * n_cols
    if ONE_PASS:
        cols = tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        dw_acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for row in range(pid, n_rows, n_progs):
            row64 = tl.cast(row, tl.int64)
            x = tl.load(x_ptr + row64 * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_ptr + row64 * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
            rstd = tl.load(rstd_ptr + row64)
            xhat = x * rstd
            g = w * dy
            c = tl.sum(g * xhat, axis=0) / n_cols
            dx = (g - xhat * c) * rstd
            if HAS_DS:
                ds = tl.load(ds_ptr + row64 * stride_ds + cols, mask=mask, other=0.0)
                dx += ds.to(tl.float32)
            tl.store(dx_ptr + row64 * n_cols + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
            dw_acc += dy * xhat
        tl.store(partial_row + cols, dw_acc, mask=mask)
    else:
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            tl.store(partial_row + cols, tl.zeros((BLOCK_N,), dtype=tl.float32), mask=cols < n_cols)
        for row in range(pid, n_rows, n_progs):
            row64 = tl.cast(row, tl.int64)
            rstd = tl.load(rstd_ptr + row64)
            acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
            for start in range(0, n_cols, BLOCK_N):
                cols = start + tl.arange(0, BLOCK_N)
                mask = cols < n_cols
                x = tl.load(x_ptr + row64 * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(dy_ptr + row64 * stride_dy + cols, mask=mask, other=0.0)
                w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
                acc += w * dy.to(tl.float32) * x
            c = tl.sum(acc, axis=0) * rstd / n_cols
            for start in range(0, n_cols, BLOCK_N):
                cols = start + tl.arange(0, BLOCK_N)
                mask = cols < n_cols
                x = tl.load(x_ptr + row64 * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(dy_ptr + row64 * stride_dy + cols, mask=mask, other=0.0)
                dy = dy.to(tl.float32)
                w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
                xhat = x * rstd
                dx = (w * dy - xhat * c) * rstd
                if HAS_DS:
                    ds = tl.load(ds_ptr + row64 * stride_ds + cols, mask=mask, other=0.0)
                    dx += ds.to(tl.float32)
                tl.store(dx_ptr + row64 * n_cols + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
                # Same offsets, shape and layout as the zeroing store: each thread reads back
                # only what it wrote, so no barrier is needed.
                part = tl.load(partial_row + cols, mask=mask, other=0.0)
                tl.store(partial_row + cols, part + dy * xhat, mask=mask)


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
    dx_ptr,
    dw_partial_ptr,
    BLOCK_N: tl.constexpr,
    ONE_PASS: tl.constexpr,
):
    rms_norm_bwd_rows(
        dy_ptr, x_ptr, w_ptr, rstd_ptr, dy_ptr, n_rows, n_cols, stride_dy, stride_x, 0,
        dx_ptr, dw_partial_ptr, BLOCK_N, ONE_PASS, False,
    )  # fmt: skip
