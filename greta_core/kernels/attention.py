"""Attention forward, FlashAttention-2 style: one pass over K/V with an online softmax.

One program owns BLOCK_M query rows of one (batch, query head). It walks the key/value
blocks that those rows can see, keeping a running row maximum ``m``, row sum ``l`` and
un-normalised output ``acc`` in fp32; scores stay in registers and never reach memory.

Sequence lengths: without ``q_lens``/``kv_lens`` every batch row has q_len = Sq and
kv_len = Skv. Query row i (< q_len) sits at absolute position kv_len - q_len + i (queries
are the *last* q_len tokens, as in decode and chunked prefill) and sees keys j < kv_len,
and j <= its position when causal. Rows i >= q_len are written as zeros (logsumexp -inf).

Key/value blocks that no row of the program can see are skipped; blocks that every row
sees entirely run without masks, and only the boundary blocks pay for the mask.

Argument order follows the binding convention shared with jax-triton: input pointers,
then scalars, then output pointers, then constexprs.
"""

from __future__ import annotations

import triton
import triton.language as tl

# The int arguments the forward kernel leaves unspecialised on 16-divisibility (a 1 is still
# the constexpr 1): the lengths and head counts. Each pattern of their divisibility was one
# more wheel entry per kind of call, while the code differs little: at an all-divisible
# 2048-token call on gfx942, 0.3% more instructions in the prefill, 2% in the decode step,
# about the same registers (bench/attention_int_specialisation.py,
# bench/results/kernel_build/attention_int_specialisation_gfx942.json), which is the code
# a call at any other length ran already. The backward keeps Sq (kernels/attention_bwd.py).
UNALIGNED_INTS: tuple[str, ...] = ("Sq", "Skv", "H_Q", "GROUP")


@triton.jit
def load_tile(base, offs_rows, stride, n_rows, offs_d, UPCAST: tl.constexpr):
    """Rows `offs_rows` of a [n_rows, D] tile at `base` (row stride `stride`), rows past
    n_rows read as zeros."""
    tile = tl.load(
        base + offs_rows[:, None] * stride + offs_d[None, :],
        mask=offs_rows[:, None] < n_rows,
        other=0.0,
    )
    if UPCAST:
        # Triton's CPU interpreter keeps bf16 as raw uint16: only casts are exact there.
        tile = tile.to(tl.float32)
    return tile


@triton.jit
def head_base(ptr, b, h, stride_b, stride_h):
    """Where head h of batch item b starts; int64 offsets, so a tensor past 2**31 elements
    does not wrap."""
    return ptr + b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h


@triton.jit
def query_head(H_Q, GROUP):
    """(program axis 1 = batch * H_Q + head, batch item, query head, its KV head) of this
    program."""
    pid_bh = tl.program_id(1)
    b = pid_bh // H_Q
    h = pid_bh % H_Q
    return pid_bh, b, h, h // GROUP


@triton.jit
def scale_log2(sm_scale):
    """The softmax scale with log2(e) folded in (exp2 instead of exp). The cast keeps the
    math fp32 when a binding passes an fp64 scalar (jax-triton types Python floats as fp64)."""
    return tl.cast(sm_scale, tl.float32) * 1.4426950408889634


@triton.jit
def _attn_blocks(
    acc,
    l_i,
    m_i,
    q,
    k_base,
    v_base,
    stride_ks,
    stride_vs,
    pos_m,
    kv_len,
    qk_scale,
    lo,
    hi,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    UPCAST: tl.constexpr,
    ZERO_NAN: tl.constexpr,
):
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + offs_n0
        k_ptrs = k_base + offs_n[:, None] * stride_ks + offs_d[None, :]
        v_ptrs = v_base + offs_n[:, None] * stride_vs + offs_d[None, :]
        if MASKED:  # noqa: SIM108  (constexpr branch in a Triton kernel)
            k = tl.load(k_ptrs, mask=offs_n[:, None] < kv_len, other=0.0)
        else:
            k = tl.load(k_ptrs)
        if UPCAST:
            k = k.to(tl.float32)
        qk = tl.dot(q, tl.trans(k))
        if MASKED:
            visible = offs_n[None, :] < kv_len
            if CAUSAL:
                visible = visible & (offs_n[None, :] <= pos_m[:, None])
            qk = tl.where(visible, qk * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            # A row that sees no key yet keeps m = -inf; subtract 0 instead (no inf - inf).
            m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            qk = qk * qk_scale
            m_sub = m_new
        p = tl.math.exp2(qk - m_sub[:, None])
        alpha = tl.math.exp2(m_i - m_sub)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if MASKED:  # noqa: SIM108
            v = tl.load(v_ptrs, mask=offs_n[:, None] < kv_len, other=0.0)
        else:
            v = tl.load(v_ptrs)
        p_dtype = v.dtype
        if UPCAST:
            v = v.to(tl.float32)
        if ZERO_NAN:
            # A NaN value of a key some rows cannot see would reach them as 0 * NaN through
            # the dot: the dot takes it as 0 here, and the kernel marks the rows that see it.
            v = tl.where(v == v, v, tl.zeros_like(v))
        if UPCAST:
            acc = tl.dot(p.to(p_dtype).to(tl.float32), v, acc)
        else:
            acc = tl.dot(p.to(p_dtype), v, acc)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _first_nan_key(
    v_base, stride_vs, kv_len, lo, hi, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
):  # fmt: skip
    """The lowest key whose value holds a NaN among the blocks [lo, hi) loads, else kv_len.
    Whole blocks: the last one may load keys past hi (BLOCK_N > BLOCK_M), which the rows
    cannot see and which reach them as 0 * NaN all the same; keys past kv_len read as
    zeros."""
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    first = kv_len
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        v = load_tile(v_base, offs_n, stride_vs, kv_len, offs_d, UPCAST)
        key_nan = tl.max((v != v).to(tl.int32), 1)  # [BLOCK_N]
        first = tl.minimum(first, tl.min(tl.where(key_nan > 0, offs_n, kv_len), 0))
    return first


@triton.jit(do_not_specialize_on_alignment=UNALIGNED_INTS)
def attention_fwd_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    q_lens_ptr,
    kv_lens_ptr,
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
    stride_ob,
    stride_oh,
    stride_os,
    o_ptr,
    lse_ptr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_LENS: tl.constexpr,
    UPCAST: tl.constexpr,
):
    num_m = tl.cdiv(Sq, BLOCK_M)
    pid_m = tl.program_id(0)
    if CAUSAL:
        # The last query blocks see the most keys: start them first for a better tail.
        pid_m = num_m - 1 - pid_m
    pid_bh, b, h, h_kv = query_head(H_Q, GROUP)

    if HAS_LENS:
        q_len = tl.minimum(tl.load(q_lens_ptr + b), Sq)
        kv_len = tl.minimum(tl.load(kv_lens_ptr + b), Skv)
    else:
        q_len = Sq
        kv_len = Skv

    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    shift = kv_len - q_len
    pos_m = shift + offs_m

    q_base = head_base(q_ptr, b, h, stride_qb, stride_qh)
    k_base = head_base(k_ptr, b, h_kv, stride_kb, stride_kh)
    v_base = head_base(v_ptr, b, h_kv, stride_vb, stride_vh)
    # Key range this program needs: [0, hi); [0, full_end) is visible to all of its rows.
    last_row = tl.minimum(start_m + BLOCK_M, q_len) - 1
    if CAUSAL:
        hi = tl.minimum(kv_len, shift + last_row + 1)
        full_end = tl.minimum(kv_len, shift + start_m + 1)
    else:
        hi = kv_len
        full_end = kv_len
    hi = tl.where(start_m < q_len, hi, 0)
    hi = tl.maximum(hi, 0)
    full_end = tl.maximum(tl.minimum(full_end, hi), 0)
    full_end = (full_end // BLOCK_N) * BLOCK_N

    # Causal: a NaN value of a key that only some rows of the diagonal blocks see. Found
    # before the loops, not in them: testing v there put the masked loop's registers on
    # sm_90 at D64 at 187 per thread against 126 (two CTAs per SM instead of four, the
    # forward 17% slower); a program with a NaN takes the loop that zeroes it.
    first_nan = kv_len
    if CAUSAL:
        first_nan = _first_nan_key(
            v_base, stride_vs, kv_len, full_end, hi, HEAD_DIM, BLOCK_N, UPCAST
        )
    q = load_tile(q_base, offs_m, stride_qs, Sq, offs_d, UPCAST)

    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
    qk_scale = scale_log2(sm_scale)

    acc, l_i, m_i = _attn_blocks(
        acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, pos_m, kv_len, qk_scale,
        0, full_end, HEAD_DIM, BLOCK_N, False, CAUSAL, UPCAST, False,
    )  # fmt: skip
    if first_nan < kv_len:
        acc, l_i, m_i = _attn_blocks(
            acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, pos_m, kv_len, qk_scale,
            full_end, hi, HEAD_DIM, BLOCK_N, True, CAUSAL, UPCAST, True,
        )  # fmt: skip
        # The rows that see the first NaN key (a later one's rows see it too), whole rows:
        # a per-column mark needs a second dot, whose tiles overflow an H100's shared
        # memory at D=128.
        acc = tl.where(pos_m[:, None] >= first_nan, float("nan"), acc)
    else:
        acc, l_i, m_i = _attn_blocks(
            acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, pos_m, kv_len, qk_scale,
            full_end, hi, HEAD_DIM, BLOCK_N, True, CAUSAL, UPCAST, False,
        )  # fmt: skip

    # l_i is exactly 0 only for a row that sees no key (zeros out, lse -inf); a NaN from the
    # inputs keeps the row (NaN out, as in SDPA).
    row_ok = (offs_m < q_len) & (l_i != 0.0)
    l_safe = tl.where(row_ok, l_i, 1.0)
    out = tl.where(row_ok[:, None], acc / l_safe[:, None], 0.0)
    lse = tl.where(row_ok, (m_i + tl.math.log2(l_safe)) * 0.6931471805599453, float("-inf"))

    o_base = head_base(o_ptr, b, h, stride_ob, stride_oh)
    tl.store(
        o_base + offs_m[:, None] * stride_os + offs_d[None, :],
        out.to(o_ptr.dtype.element_ty),
        mask=offs_m[:, None] < Sq,
    )
    tl.store(lse_ptr + pid_bh.to(tl.int64) * Sq + offs_m, lse, mask=offs_m < Sq)


def features(head_dim: int, seq_q: int, seq_kv: int, causal: bool) -> dict[str, object]:
    """What the config tables' rules key on."""
    return {"D": head_dim, "Sq": seq_q, "Skv": seq_kv, "causal": bool(causal)}
