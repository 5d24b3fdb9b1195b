"""KV-cache append for decoding: copy new k/v tokens into the caches at each batch item's
current length, in place, and write the new lengths.

k_cache/v_cache: [batch, heads_kv, max_seq, head_dim]; k/v: [batch, heads_kv, new_tokens,
head_dim]; cache_lens: int32 [batch]. Token t of batch b lands at cache_lens[b] + t.
Positions outside [0, max_seq) are never written (the device-side guard against overflow;
the launchers check on the host where that is cheap). The last dim must be contiguous; other
dims take strides. ``k_cache_in``/``v_cache_in`` are the same buffers as ``k_cache_ptr``/
``v_cache_ptr``: jax-triton passes an aliased buffer once as input and once as output.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def kv_cache_append_kernel(
    k_ptr, v_ptr, lens_ptr, k_cache_in, v_cache_in,
    n_heads, n_new, max_seq, head_dim,
    stride_kb, stride_kh, stride_kt,
    stride_vb, stride_vh, stride_vt,
    stride_kcb, stride_kch, stride_kcs,
    stride_vcb, stride_vch, stride_vcs,
    k_cache_ptr, v_cache_ptr, new_lens_ptr,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    b = (pid // n_heads).to(tl.int64)
    h = (pid % n_heads).to(tl.int64)
    t_block = tl.program_id(1)
    length = tl.load(lens_ptr + b)
    t = t_block * BLOCK_T + tl.arange(0, BLOCK_T)
    d = tl.arange(0, BLOCK_D)
    # int64 before the sum: a length near 2**31 must not wrap to a small position.
    pos = length.to(tl.int64) + t
    in_cache = (pos >= 0) & (pos < max_seq)
    mask = (t[:, None] < n_new) & in_cache[:, None] & (d[None, :] < head_dim)
    t64 = t.to(tl.int64)
    k = tl.load(
        k_ptr + b * stride_kb + h * stride_kh + t64[:, None] * stride_kt + d[None, :], mask=mask
    )
    v = tl.load(
        v_ptr + b * stride_vb + h * stride_vh + t64[:, None] * stride_vt + d[None, :], mask=mask
    )
    kc = k_cache_ptr + b * stride_kcb + h * stride_kch + pos[:, None] * stride_kcs + d[None, :]
    vc = v_cache_ptr + b * stride_vcb + h * stride_vch + pos[:, None] * stride_vcs + d[None, :]
    tl.store(kc, k, mask=mask)
    tl.store(vc, v, mask=mask)
    if (h == 0) & (t_block == 0):
        tl.store(new_lens_ptr + b, length + n_new)
