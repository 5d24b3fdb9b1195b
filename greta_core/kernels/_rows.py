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
def sum_partials(
    partial_ptr, n_partials, n_cols, cols, col_mask, BLOCK_N: tl.constexpr,
    BLOCK_P: tl.constexpr,
):  # fmt: skip
    """The fp32 sums over the `n_partials` rows of a [n_partials, n_cols] partials buffer at
    `cols` ([BLOCK_N]), added in row order 0, 1, ..., n_partials - 1: each column's sum is
    the same sequence of fp32 additions whatever the kernel's layout or warp count, so
    ``col_sum`` and a norm backward's last program (``REDUCE_LAST``) give the same bits.
    BLOCK_P rows per step, unrolled (their loads in flight together; the additions stay in
    order). ``.cg`` loads: the rows were written by other programs (this kernel's, under
    REDUCE_LAST) and are read from L2, never from a stale line of this core's L1."""
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for start in range(0, n_partials, BLOCK_P):
        for r in tl.static_range(BLOCK_P):
            p = start + r
            row = partial_ptr + tl.cast(p, tl.int64) * n_cols
            acc += tl.load(
                row + cols, mask=col_mask & (p < n_partials), other=0.0, cache_modifier=".cg"
            )
    return acc


@triton.jit
def _reduce_last(
    dw_partial_ptr, db_partial_ptr, n_progs, n_cols, dw_ptr, db_ptr, counter_ptr,
    CENTER: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr,
    WAIT_STORES: tl.constexpr,
):  # fmt: skip
    """After this program stored its partial row(s): count it done; the last program to do
    so adds every program's partials (``sum_partials``: program order 0..P-1) into dweight
    (and dbias), in their dtype, and sets the counter back to 0 for the next launch.

    Why the last program sees every partial (the CUTLASS semaphore pattern):

    - ``tl.debug_barrier()``: bar.sync on NVIDIA, where it orders every thread's partial
      stores (CTA scope) before what follows in the program. On AMD (gfx942, Triton 3.6)
      it is a bare s_barrier: no wave waits for its stores to complete before it (the
      compiled code shows no s_waitcnt there), so WAIT_STORES (the plan's ``store_wait``:
      1 gfx9, 2 gfx10/11, 3 gfx12) puts the arch's wait for outstanding stores in every
      wave first (``s_waitcnt vmcnt(0)`` on gfx942): each wave's partial stores have
      reached the L2 before any wave passes the barrier.
    - The scalar ``tl.atomic_add(..., sem="acq_rel", scope="gpu")``: Triton runs a scalar
      atomic on one thread of the program (the others' predicate is off) and hands its
      result to all through shared memory and a barrier. On NVIDIA it is
      ``atom.acq_rel.gpu.global.add``; its release is cumulative in the PTX memory model,
      so the other threads' stores, ordered before it by bar.sync, are visible at gpu scope
      to whoever acquires the counter's new value. On AMD it is an agent-scope acq_rel
      atomicrmw: ``buffer_wbl2 sc1`` (release: the L2's lines written back, every wave's
      partials among them, for the other XCDs of a gfx942, whose L2s are their own) and
      ``s_waitcnt vmcnt(0)`` before it, ``buffer_inv sc1`` (acquire) after it. Verified
      on the Triton interpreter only so far: the GPU test of
      ``tests/test_norm_bwd_one_launch.py`` is the check on hardware (no AMD GPU has run
      it yet).
    - The program that reads ``n_progs - 1`` acquired every other program's release (the
      counter's modification order holds all n_progs increments before its own), and its
      other threads read the partials only after the barrier that hands them the atomic's
      result: the acquire happens before their loads. Those loads are ``.cg`` (L2 on
      NVIDIA; the gfx942 cache bits for it): no L1 line from before can answer them.
    - The counter goes back to 0 with a plain store: the next kernel that uses it runs
      after this one ends on the same stream, and a kernel's end publishes its stores.
    """
    if WAIT_STORES:  # AMD: every wave's stores complete before the barrier (see above)
        if WAIT_STORES == 1:  # gfx9 (CDNA): stores count in vmcnt
            wait: tl.constexpr = "s_waitcnt vmcnt(0)"
        elif WAIT_STORES == 2:  # gfx10, gfx11 (RDNA 2-3): in vscnt
            wait: tl.constexpr = "s_waitcnt_vscnt null, 0x0"
        else:  # gfx12 (RDNA 4): in storecnt
            wait: tl.constexpr = "s_wait_storecnt 0x0"
        # One instruction, its output tied to its input ("0"): no escape sequence in the
        # source, which torch.compile's Inductor copies into a string of its own.
        tl.inline_asm_elementwise(
            wait,
            "=v,0",
            [n_cols],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )
    tl.debug_barrier()
    done = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    if done == n_progs - 1:
        for start in range(0, n_cols, BLOCK_R):
            cols = start + tl.arange(0, BLOCK_R)
            mask = cols < n_cols
            dw = sum_partials(dw_partial_ptr, n_progs, n_cols, cols, mask, BLOCK_R, BLOCK_P)
            tl.store(dw_ptr + cols, dw.to(dw_ptr.dtype.element_ty), mask=mask)
            if CENTER:
                db = sum_partials(db_partial_ptr, n_progs, n_cols, cols, mask, BLOCK_R, BLOCK_P)
                tl.store(db_ptr + cols, db.to(db_ptr.dtype.element_ty), mask=mask)
        tl.store(counter_ptr, 0)


@triton.jit
def norm_bwd_rows(
    dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, ds_ptr,
    n_rows, n_cols, stride_dy, stride_x, stride_ds,
    dx_ptr, dw_partial_ptr, db_partial_ptr, dw_ptr, db_ptr, counter_ptr,
    BLOCK_N: tl.constexpr, ONE_PASS: tl.constexpr, CENTER: tl.constexpr, HAS_DS: tl.constexpr,
    REDUCE_LAST: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr,
    WAIT_STORES: tl.constexpr,
):  # fmt: skip
    """The backward of this program's rows of a norm, g = w * dy:
    RMSNorm (CENTER off): dx = rstd * (g - xhat * mean(g * xhat)), xhat = x * rstd;
    LayerNorm (CENTER): dx = rstd * (g - xhat * mean(g * xhat) - mean(g)), xhat = (x - mean)
    * rstd, and the bias partials (mean_ptr / db_partial_ptr are unread without CENTER).
    HAS_DS: the gradient `ds` reaching the normed input directly is added to dx (add_rms_norm;
    ds_ptr is unread without). Writes one fp32 partial row of dweight (and dbias) per
    program; ``col_sum`` adds them, or with REDUCE_LAST the last program to finish does
    (``_reduce_last``: one launch, not two; dw_ptr, db_ptr and counter_ptr are unread
    without it, and BLOCK_R / BLOCK_P, its column block and unroll, and WAIT_STORES, AMD's
    wait for each wave's stores before the barrier, unused)."""
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
    if REDUCE_LAST:
        _reduce_last(
            dw_partial_ptr, db_partial_ptr, n_progs, n_cols, dw_ptr, db_ptr, counter_ptr,
            CENTER, BLOCK_R, BLOCK_P, WAIT_STORES,
        )  # fmt: skip
