"""GEMM: C = A @ B (+ bias), fp16/bf16 operands, fp32 accumulation, output in the input dtype.

One program computes a BLOCK_M x BLOCK_N tile of C. Programs are numbered in groups of
GROUP_M tile rows ("swizzled" order) so that programs running at the same time share
A rows and B columns in L2. Rows/columns past M/N are clamped to valid addresses by a
modulo (no mask in the K loop) and dropped by the masked store; a K tail is masked only
when K is not a multiple of BLOCK_K (EVEN_K).

Argument order follows the binding convention shared with jax-triton: input pointers,
then scalars, then output pointers, then constexprs.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def matmul_kernel(
    a_ptr,
    b_ptr,
    bias_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    c_ptr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr,
    INT64: tl.constexpr,
    UPCAST: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Wrap out-of-range rows/cols onto valid ones: loads stay in bounds without masks.
    offs_am = offs_m % M
    offs_bn = offs_n % N
    if INT64:
        offs_am = offs_am.to(tl.int64)
        offs_bn = offs_bn.to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if UPCAST:
            # Triton's CPU interpreter keeps bf16 as raw uint16: only casts are exact there.
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)
        acc += bias.to(tl.float32)[None, :]

    c = acc.to(c_ptr.dtype.element_ty)
    if INT64:
        offs_m = offs_m.to(tl.int64)
        offs_n = offs_n.to(tl.int64)
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, c, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def features(m: int, n: int, k: int) -> dict[str, int]:
    """What the config tables' rules key on."""
    return {"M": m, "N": n, "K": k}
