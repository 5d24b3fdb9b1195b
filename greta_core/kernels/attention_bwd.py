"""Attention backward, FlashAttention-2 style: recompute the probabilities block by block.

Given the forward's output ``o`` and row logsumexp ``lse`` (natural log), with
``delta_i = sum_d o_id * do_id``:

    p_ij  = exp(scale * q_i.k_j - lse_i)          (0 where key j is not visible to row i)
    dv_j  = sum_i p_ij do_i
    ds_ij = p_ij (do_i.v_j - delta_i)
    dq_i  = scale * sum_j ds_ij k_j
    dk_j  = scale * sum_i ds_ij q_i

Probabilities are computed as exp2 with log2(e) folded into the scale and the logsumexp.
Only the blocks on the causal diagonal or at a ragged sequence end pay for masks; blocks
that every row of the tile sees in full load and compute without them.

``delta`` comes from a small preprocess kernel (one program per query block and head) that
reads ``o`` and ``do`` in their dtype and writes fp32 rows.

Two kernels, so nothing is accumulated with atomics (deterministic): ``dkdv`` gives one
program per (key block, batch, KV head): its k, v tile stays resident while it walks, for
each query head of the GQA group in turn, the query blocks that see those keys, summing the
group's dk/dv in fp32 registers; ``dq`` gives one program per (query block, batch, query
head) and walks the key blocks it sees. Each result is stored once, rounded from its fp32
accumulator to the output buffer's dtype (the inputs'): dq [B, Hq, Sq, D], dk/dv
[B, Hkv, Skv, D]; no fp32 gradient reaches memory. Seven block products per (query block,
key block) pair: ``dq`` recomputes p and dp. (A one-kernel variant that added dq with
atomics, five products per pair, measured slower on the H100 and was removed.)

Positions follow the forward: query row i sits at Skv - Sq + i (no per-batch lengths here).
"""

from __future__ import annotations

import triton
import triton.language as tl

from greta_core.kernels.attention import head_base, load_tile, query_head, scale_log2
from greta_install import triton_range

# The 16-bit row store's form: a block pointer where Triton still has them (fewer registers
# on sm_90, see _store_rows), a masked tensor of pointers from Triton 3.9 on.
BLOCK_POINTER_STORE = tl.constexpr(triton_range.has_block_pointers(triton.__version__))
# The forward's unspecialised ints (kernels/attention.py UNALIGNED_INTS) less Sq: the rows of
# lse and delta start at multiples of Sq, and without its divisibility the dk/dv kernel's
# loop loads them one word at a time (gfx942: 192 global_load_dword against 48 dwordx4,
# 28% more instructions; bench/attention_int_specialisation.py). Training lengths are
# mostly 16-divisible, so the wheel compiles both (ops/attention_bwd.py AOT_SEQS).
UNALIGNED_INTS: tuple[str, ...] = ("Skv", "H_Q", "GROUP")


@triton.jit
def _load_rows(base, offs_rows, stride, n_rows, offs_d, MASKED: tl.constexpr, UPCAST: tl.constexpr):
    if MASKED:
        tile = load_tile(base, offs_rows, stride, n_rows, offs_d, UPCAST)
    else:
        tile = tl.load(base + offs_rows[:, None] * stride + offs_d[None, :])
        if UPCAST:
            tile = tile.to(tl.float32)
    return tile


@triton.jit
def _store_rows(base, offs_rows, n_rows, tile, HEAD_DIM: tl.constexpr, UPCAST: tl.constexpr):
    """Store fp32 `tile` as rows `offs_rows` (consecutive) of a contiguous [n_rows, HEAD_DIM]
    buffer (rows past n_rows dropped), rounded once to the buffer's dtype: to nearest, ties
    to even, the bits of an fp32 store followed by torch's ``.to()``."""
    out_ty = base.dtype.element_ty
    val = tile.to(out_ty)
    if UPCAST and out_ty == tl.bfloat16:
        # Triton's CPU interpreter truncates fp32 -> bf16 (compiled code rounds to
        # nearest even): round the bits here. NaN keeps the plain cast (no carry into
        # the sign).
        bits = tile.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        rounded = (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        val = tl.where(tile == tile, rounded, val)
    # A block pointer, not a tensor of pointers, at the first row taken from offs_rows (not
    # from the program id): on sm_90 (Triton 3.6) either other form of this 16-bit store took
    # 6-30 more registers per thread, one CTA per SM fewer for dq at D128 (ptxas -v of the
    # AOT specs).
    if BLOCK_POINTER_STORE:
        row0 = tl.min(offs_rows, 0)
        rows = tl.make_block_ptr(
            base, (n_rows, HEAD_DIM), (HEAD_DIM, 1), (row0, 0), (tile.shape[0], HEAD_DIM), (1, 0)
        )
        tl.store(rows, val, boundary_check=(0,))
    else:
        cols = tl.arange(0, HEAD_DIM)
        ptrs = base + offs_rows[:, None] * HEAD_DIM + cols[None, :]
        tl.store(ptrs, val, mask=(offs_rows < n_rows)[:, None])


@triton.jit
def _row_stats(lse_ptr, delta_ptr, offs_m, Sq, MASKED: tl.constexpr):
    """(lse in log2 units, delta) of rows offs_m; a row past Sq gets lse +inf (p = 0)."""
    if MASKED:
        lse = tl.load(lse_ptr + offs_m, mask=offs_m < Sq, other=float("inf"))
        delta = tl.load(delta_ptr + offs_m, mask=offs_m < Sq, other=0.0)
    else:
        lse = tl.load(lse_ptr + offs_m)
        delta = tl.load(delta_ptr + offs_m)
    return lse * 1.4426950408889634, delta


@triton.jit(do_not_specialize_on_alignment=UNALIGNED_INTS)
def attention_bwd_delta_kernel(
    o_ptr,
    do_ptr,
    Sq,
    H_Q,
    stride_ob,
    stride_oh,
    stride_os,
    stride_dob,
    stride_doh,
    stride_dos,
    delta_ptr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """delta [B, H_Q, Sq] fp32 = rowsum(o * do): one program per (query block, batch, head)."""
    pid_m = tl.program_id(0)
    pid_bh, b, h, _ = query_head(H_Q, 1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    o_base = head_base(o_ptr, b, h, stride_ob, stride_oh)
    do_base = head_base(do_ptr, b, h, stride_dob, stride_doh)
    o = load_tile(o_base, offs_m, stride_os, Sq, offs_d, UPCAST).to(tl.float32)
    do = load_tile(do_base, offs_m, stride_dos, Sq, offs_d, UPCAST).to(tl.float32)
    delta = tl.sum(o * do, axis=1)
    tl.store(delta_ptr + pid_bh.to(tl.int64) * Sq + offs_m, delta, mask=offs_m < Sq)


@triton.jit
def _p_t(
    k, q, lse2, offs_m, offs_n, Sq, Skv, shift, qk_scale,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    """p^T [BLOCK_N, BLOCK_M] fp32 of one key block against one query block."""
    qk_t = tl.dot(k, tl.trans(q))
    p_t = tl.math.exp2(qk_t * qk_scale - lse2[None, :])
    if MASKED:
        visible = (offs_n[:, None] < Skv) & (offs_m[None, :] < Sq)
        if CAUSAL:
            visible = visible & (offs_n[:, None] <= shift + offs_m[None, :])
        # lse = -inf marks a row that saw no key: its probabilities are all zero.
        p_t = tl.where(visible & (lse2[None, :] > float("-inf")), p_t, 0.0)
    return p_t


@triton.jit
def _query_ranges(
    start_n, Sq, Skv, shift, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr
):
    """(lo, mid, full_end) of the key block at start_n: query blocks [lo, mid) see part of it
    (causal diagonal), [mid, full_end) see all of it and run without masks, [full_end, Sq)
    is the ragged last query block."""
    lo = 0
    mid = 0
    if CAUSAL:
        lo = tl.maximum(start_n - shift, 0) // BLOCK_M * BLOCK_M
        first_full = tl.maximum(start_n + BLOCK_N - 1 - shift, 0)
        mid = tl.maximum((first_full + BLOCK_M - 1) // BLOCK_M * BLOCK_M, lo)
    # A ragged key block (past Skv) is masked against every query block.
    mid = tl.where(start_n + BLOCK_N <= Skv, tl.minimum(mid, Sq), Sq)
    full_end = tl.maximum(Sq // BLOCK_M * BLOCK_M, mid)
    return lo, mid, full_end


@triton.jit
def _dkdv_blocks(
    dk, dv, k, v, q_group, do_group, lse_group, delta_group, stride_qh, stride_qs, stride_doh,
    stride_dos, GROUP, offs_n, offs_d, Sq, Skv, shift, qk_scale, lo, hi,
    BLOCK_M: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """Query blocks [lo, hi) of each of the GROUP query heads in turn (`*_group`: the group's
    first head). One flat loop, the head (g) and block (start_m) carried as scalars: a loop
    over heads around the block loop compiled to more registers on sm_90 (spills at D128)."""
    offs_m0 = tl.arange(0, BLOCK_M)
    n_blocks = (hi - lo + BLOCK_M - 1) // BLOCK_M
    start_m = lo
    g = 0
    for _ in range(0, n_blocks * GROUP):
        offs_m = start_m + offs_m0
        q = _load_rows(q_group + g * stride_qh, offs_m, stride_qs, Sq, offs_d, MASKED, UPCAST)
        do = _load_rows(do_group + g * stride_doh, offs_m, stride_dos, Sq, offs_d, MASKED, UPCAST)
        lse2, delta = _row_stats(lse_group + g * Sq, delta_group + g * Sq, offs_m, Sq, MASKED)
        p_t = _p_t(k, q, lse2, offs_m, offs_n, Sq, Skv, shift, qk_scale, MASKED, CAUSAL)
        dv = tl.dot(p_t.to(do.dtype), do, dv)
        dp_t = tl.dot(v, tl.trans(do))
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk)
        start_m += BLOCK_M
        wrap = start_m >= hi
        start_m = tl.where(wrap, lo, start_m)
        g += wrap.to(tl.int32)
    return dk, dv


@triton.jit(do_not_specialize_on_alignment=UNALIGNED_INTS)
def attention_bwd_dkdv_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    do_ptr,
    lse_ptr,
    delta_ptr,
    sm_scale,
    Sq,
    Skv,
    H_Q,
    GROUP,
    stride_qb,
    stride_qh,
    stride_qs,
    stride_kb,
    stride_kh,
    stride_ks,
    stride_vb,
    stride_vh,
    stride_vs,
    stride_dob,
    stride_doh,
    stride_dos,
    dk_ptr,
    dv_ptr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """dk, dv [B, H_Q // GROUP, Skv, D] in dk_ptr's dtype: one program per (key block,
    batch, KV head), summing over the GROUP query heads that read the KV head."""
    pid_n = tl.program_id(0)
    pid_bkv = tl.program_id(1)
    heads_kv = H_Q // GROUP
    b = pid_bkv // heads_kv
    h_kv = pid_bkv % heads_kv
    shift = Skv - Sq
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)

    k_base = head_base(k_ptr, b, h_kv, stride_kb, stride_kh)
    v_base = head_base(v_ptr, b, h_kv, stride_vb, stride_vh)
    k = load_tile(k_base, offs_n, stride_ks, Skv, offs_d, UPCAST)
    v = load_tile(v_base, offs_n, stride_vs, Skv, offs_d, UPCAST)
    qk_scale = scale_log2(sm_scale)  # log2(e) is folded into lse in _row_stats too

    dk = tl.zeros((BLOCK_N, HEAD_DIM), dtype=tl.float32)
    dv = tl.zeros((BLOCK_N, HEAD_DIM), dtype=tl.float32)
    lo, mid, full_end = _query_ranges(start_n, Sq, Skv, shift, BLOCK_M, BLOCK_N, CAUSAL)
    # The group's first query head h0 and its rows of lse/delta ([B, H_Q, Sq]); the group's
    # other heads are int32 offsets from these, like the rows within a head.
    h0 = (h_kv * GROUP).to(tl.int64)
    q_group = head_base(q_ptr, b, h0, stride_qb, stride_qh)
    do_group = head_base(do_ptr, b, h0, stride_dob, stride_doh)
    lse_group = lse_ptr + (b.to(tl.int64) * H_Q + h0) * Sq
    delta_group = delta_ptr + (b.to(tl.int64) * H_Q + h0) * Sq
    dk, dv = _dkdv_blocks(
        dk, dv, k, v, q_group, do_group, lse_group, delta_group, stride_qh, stride_qs,
        stride_doh, stride_dos, GROUP, offs_n, offs_d, Sq, Skv, shift, qk_scale, lo, mid,
        BLOCK_M, True, CAUSAL, UPCAST,
    )  # fmt: skip
    dk, dv = _dkdv_blocks(
        dk, dv, k, v, q_group, do_group, lse_group, delta_group, stride_qh, stride_qs,
        stride_doh, stride_dos, GROUP, offs_n, offs_d, Sq, Skv, shift, qk_scale, mid,
        full_end, BLOCK_M, False, CAUSAL, UPCAST,
    )  # fmt: skip
    dk, dv = _dkdv_blocks(
        dk, dv, k, v, q_group, do_group, lse_group, delta_group, stride_qh, stride_qs,
        stride_doh, stride_dos, GROUP, offs_n, offs_d, Sq, Skv, shift, qk_scale, full_end,
        Sq, BLOCK_M, True, CAUSAL, UPCAST,
    )  # fmt: skip
    dk = dk * sm_scale

    out = pid_bkv.to(tl.int64) * Skv * HEAD_DIM
    _store_rows(dk_ptr + out, offs_n, Skv, dk, HEAD_DIM, UPCAST)
    _store_rows(dv_ptr + out, offs_n, Skv, dv, HEAD_DIM, UPCAST)


@triton.jit
def _dq_blocks(
    dq, q, do, lse2, delta, k_base, v_base, stride_ks, stride_vs, offs_m, offs_d, Sq, Skv,
    shift, qk_scale, lo, hi,
    BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        k = _load_rows(k_base, offs_n, stride_ks, Skv, offs_d, MASKED, UPCAST)
        v = _load_rows(v_base, offs_n, stride_vs, Skv, offs_d, MASKED, UPCAST)
        qk = tl.dot(q, tl.trans(k))
        p = tl.math.exp2(qk * qk_scale - lse2[:, None])
        if MASKED:
            visible = (offs_m[:, None] < Sq) & (offs_n[None, :] < Skv)
            if CAUSAL:
                visible = visible & (offs_n[None, :] <= shift + offs_m[:, None])
            p = tl.where(visible & (lse2[:, None] > float("-inf")), p, 0.0)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)
    return dq


@triton.jit(do_not_specialize_on_alignment=UNALIGNED_INTS)
def attention_bwd_dq_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    do_ptr,
    lse_ptr,
    delta_ptr,
    sm_scale,
    Sq,
    Skv,
    H_Q,
    GROUP,
    stride_qb,
    stride_qh,
    stride_qs,
    stride_kb,
    stride_kh,
    stride_ks,
    stride_vb,
    stride_vh,
    stride_vs,
    stride_dob,
    stride_doh,
    stride_dos,
    dq_ptr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    UPCAST: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh, b, h, h_kv = query_head(H_Q, GROUP)
    shift = Skv - Sq
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)

    q_base = head_base(q_ptr, b, h, stride_qb, stride_qh)
    do_base = head_base(do_ptr, b, h, stride_dob, stride_doh)
    q = load_tile(q_base, offs_m, stride_qs, Sq, offs_d, UPCAST)
    do = load_tile(do_base, offs_m, stride_dos, Sq, offs_d, UPCAST)
    row_base = pid_bh.to(tl.int64) * Sq
    lse2, delta = _row_stats(lse_ptr + row_base, delta_ptr + row_base, offs_m, Sq, True)
    k_base = head_base(k_ptr, b, h_kv, stride_kb, stride_kh)
    v_base = head_base(v_ptr, b, h_kv, stride_vb, stride_vh)
    qk_scale = scale_log2(sm_scale)

    dq = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
    # Keys past the last row's position are invisible to the whole block (causal); keys
    # [0, full_end) are visible to every row and run without masks. Rows past Sq need no
    # mask there either: their lse is +inf, so their p is exactly 0.
    hi = Skv
    full_end = Skv
    if CAUSAL:
        hi = tl.maximum(tl.minimum(Skv, shift + start_m + BLOCK_M), 0)
        full_end = tl.maximum(tl.minimum(Skv, shift + start_m + 1), 0)
    full_end = full_end // BLOCK_N * BLOCK_N
    dq = _dq_blocks(
        dq, q, do, lse2, delta, k_base, v_base, stride_ks, stride_vs, offs_m, offs_d, Sq, Skv,
        shift, qk_scale, 0, full_end, BLOCK_N, False, CAUSAL, UPCAST,
    )  # fmt: skip
    dq = _dq_blocks(
        dq, q, do, lse2, delta, k_base, v_base, stride_ks, stride_vs, offs_m, offs_d, Sq, Skv,
        shift, qk_scale, full_end, hi, BLOCK_N, True, CAUSAL, UPCAST,
    )  # fmt: skip
    dq = dq * sm_scale
    _store_rows(dq_ptr + pid_bh.to(tl.int64) * Sq * HEAD_DIM, offs_m, Sq, dq, HEAD_DIM, UPCAST)


Config = dict[str, int]


# Beside the kernels: the launch plan (ops/attention_bwd.py, whose plans give the AOT specs)
# and the tuning benches read this one rule.
def kernel_configs(arch: str, head_dim: int) -> tuple[Config, Config]:
    """(dkdv config, dq config) from the tables: block sizes + num_warps/num_stages."""
    from greta_core import configs
    from greta_core.arch import backend

    features = {"D": head_dim, "backend": backend(arch)}
    return (
        configs.lookup("attention_bwd_dkdv", arch, features),
        configs.lookup("attention_bwd_dq", arch, features),
    )


def delta_config(arch: str, head_dim: int) -> Config:
    """The delta = rowsum(o * do) preprocess kernel's config."""
    from greta_core import configs
    from greta_core.arch import backend

    return configs.lookup("attention_bwd_delta", arch, {"D": head_dim, "backend": backend(arch)})
