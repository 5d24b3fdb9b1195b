#!/usr/bin/env python3
"""Hopper warp-specialised attention on the installed Triton, against cuDNN SDPA.

The seventh session found Triton 3.6's sm_90 warp specialisation unusable for attention
(with these kernels, causal only, in a script this one replaces: the 128-row layouts hang or
abort, the 64-row ones run 1.7-2.6x slower). This script asks the same of whatever Triton is
installed (the lock now
ships 3.8/3.9), on issue 26's grid: head_dim 64 and 128, S 2048-8192, causal and not, MHA
and GQA (4 query heads per KV head), 16384 tokens per batch, hidden 2048 (32 heads at D64,
16 at D128), bf16.

Kernels (written here, not GRETA ops): a forward (``fwd``: one loop, the causal mask on
every block; ``fwd-split``: unmasked blocks in a warp-specialised loop, the diagonal block in
a second loop, the form Triton 3.6 refused at compile time) and a FlashAttention-2 backward
(delta in torch, then dk/dv per KV head summing its query heads, then dq), loading through
TMA tensor descriptors, each loop ``tl.range(..., warp_specialize=WS)``. Each tile config
runs with WS on and off.

Every (config, head_dim) runs in its own process under ``--timeout-s``: a hang, an abort or
a compile error costs that config's rows, not the run. Per shape the child checks its
outputs (forward: o; backward: dq, dk, dv) against SDPA's on the same bf16 inputs (relative
L2 error at most MAX_REL: two bf16 implementations each ~0.3% from the exact result) and
times them with ``triton.testing.do_bench`` (median). A first child per head_dim times cuDNN
SDPA (forward, forward + backward; GQA through ``enable_gqa``, or with K/V expanded to the
query heads where cuDNN refuses it: the ``sdpa_backend`` column says which) and GRETA's own
``torch.ops.greta.attention`` (the shipped kernel) on the same shapes.

The summary gives, per shape, the best passing forward and backward configs and
``ws_vs_cudnn`` = cuDNN (fwd + bwd) ms / (best fwd + best bwd) ms: issue 26's target is
>= 0.9 everywhere.

    python bench/attention_ws.py --d 64 --out DIR/attention_ws_d64.json    # ~6 min, H100
    python bench/attention_ws.py --d 128 --out DIR/attention_ws_d128.json
    python bench/attention_ws.py --dry-run --only fwd:0                    # CPU: sm_90 compile
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, "") and not any(Path(p, "greta_core").is_dir() for p in sys.path):
    sys.path.insert(0, str(ROOT))  # run from a source checkout without installing

LOG2E = tl.constexpr(1.4426950408889634)
MAX_REL = 1e-2  # relative L2 error against SDPA's bf16 result
TOKENS, HIDDEN = 16384, 2048
SEQS = (2048, 4096, 8192)
# (kind, BLOCK_M, BLOCK_N, num_stages, num_warps, warp_specialize) for the forward;
# (kind, dkdv BLOCK_M, dkdv BLOCK_N, dq BLOCK_M, dq BLOCK_N, num_stages, num_warps, ws) for
# the backward. The FlashAttention-3 layouts (128 rows per program, one 64-row half per
# consumer warp group) first; each with WS off too, the same code's plain TMA pipeline.
FWD_CONFIGS: list[tuple[Any, ...]] = [
    ("fwd", 128, 64, 2, 4, True),
    ("fwd", 128, 128, 2, 4, True),
    ("fwd", 64, 64, 2, 4, True),
    ("fwd-split", 128, 64, 2, 4, True),
    ("fwd", 128, 64, 3, 8, False),
    ("fwd", 64, 64, 3, 4, False),
]
BWD_CONFIGS: list[tuple[Any, ...]] = [
    ("bwd", 64, 128, 128, 64, 2, 4, True),
    ("bwd", 64, 64, 64, 64, 2, 4, True),
    ("bwd", 64, 128, 128, 64, 2, 8, False),
    ("bwd", 32, 64, 64, 64, 3, 4, False),
]
CONFIGS = {"fwd": FWD_CONFIGS, "bwd": BWD_CONFIGS}


def shapes(d: int) -> list[dict[str, Any]]:
    """Issue 26's grid at one head_dim: S x causal x (MHA, GQA 4:1)."""
    heads = HIDDEN // d
    return [
        {"B": TOKENS // s, "Hq": heads, "Hkv": hkv, "S": s, "D": d, "causal": causal}
        for s in SEQS
        for causal in (True, False)
        for hkv in (heads, heads // 4)
    ]


def shape_label(p: dict[str, Any]) -> str:
    kind = "MHA" if p["Hq"] == p["Hkv"] else f"GQA{p['Hq'] // p['Hkv']}"
    return f"B{p['B']} H{p['Hq']}/{p['Hkv']} S{p['S']} D{p['D']} {kind} " + (
        "causal" if p["causal"] else "full"
    )


def config_label(cfg: tuple[Any, ...]) -> str:
    if cfg[0] == "bwd":
        _, bm1, bn1, bm2, bn2, stages, warps, ws = cfg
        return f"bwd dkdv{bm1}x{bn1} dq{bm2}x{bn2} s{stages} w{warps} ws={int(ws)}"
    kind, bm, bn, stages, warps, ws = cfg
    return f"{kind} {bm}x{bn} s{stages} w{warps} ws={int(ws)}"


# --- kernels ------------------------------------------------------------------------------


@triton.jit
def _fwd_step(q, k, v, m_i, l_i, acc, qk_scale, offs_m, offs_n, MASK: tl.constexpr):
    qk = tl.dot(q, k.T) * qk_scale
    if MASK:
        qk = tl.where(offs_n[None, :] <= offs_m[:, None], qk, -1.0e6)
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    p = tl.math.exp2(qk - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc)
    return m_new, l_i, acc


@triton.jit
def _fwd_rows(q0, q1, k, v, m0, l0, acc0, m1, l1, acc1, qk_scale, offs_m0, offs_m1, offs_n,
              MASK: tl.constexpr, HALVES: tl.constexpr):  # fmt: skip
    """One key block for the program's rows: one tile, or two halves (HALVES == 2) that
    share k and v."""
    m0, l0, acc0 = _fwd_step(q0, k, v, m0, l0, acc0, qk_scale, offs_m0, offs_n, MASK)
    if HALVES == 2:
        m1, l1, acc1 = _fwd_step(q1, k, v, m1, l1, acc1, qk_scale, offs_m1, offs_n, MASK)
    return m0, l0, acc0, m1, l1, acc1


@triton.jit
def _fwd_store(o_ptr, lse_ptr, acc, m_i, l_i, row0, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr):
    # Pointer stores: a descriptor store of a tile the consumer groups split fails to
    # verify on Triton 3.6.
    rows = (row0 + tl.arange(0, ROWS)).to(tl.int64)
    offs_d = tl.arange(0, HEAD_DIM)
    out = acc / l_i[:, None]
    tl.store(o_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :], out.to(o_ptr.dtype.element_ty))
    tl.store(lse_ptr + rows, (m_i + tl.math.log2(l_i)) * 0.6931471805599453)


@triton.jit
def _query_block(S, H_Q, GROUP, BLOCK_M: tl.constexpr, ROWS: tl.constexpr,
                 CAUSAL: tl.constexpr):  # fmt: skip
    """A query-block program's place, for the forward and dq: (its first row in the flat
    [B*Hq*S] rows, its KV head's first row, start_m, the end of its key range, the offsets
    of its two row halves). Causal programs run the longest rows first."""
    if CAUSAL:  # noqa: SIM108 (Triton: a constexpr branch)
        pid_m = tl.cdiv(S, BLOCK_M) - 1 - tl.program_id(0)
    else:
        pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    h_kv = (pid_bh % H_Q) // GROUP
    start_m = pid_m * BLOCK_M
    offs_m0 = start_m + tl.arange(0, ROWS)
    kv_row0 = ((pid_bh // H_Q) * (H_Q // GROUP) + h_kv) * S
    if CAUSAL:  # noqa: SIM108 (Triton: a constexpr branch)
        hi = start_m + BLOCK_M
    else:
        hi = S
    return pid_bh * S + start_m, kv_row0, start_m, hi, offs_m0, offs_m0 + ROWS


@triton.jit
def fwd_kernel(
    desc_q, desc_k, desc_v, o_ptr, lse_ptr, sm_scale, S, H_Q, GROUP,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, SPLIT: tl.constexpr, WS: tl.constexpr, HALVES: tl.constexpr,
):  # fmt: skip
    """One program per (query block, batch x query head); causal programs run the longest
    rows first. SPLIT: the blocks left of the diagonal unmasked in the (warp-specialised)
    loop, the diagonal block masked after it. HALVES == 2: the BLOCK_M rows as two halves
    (two q loads, two softmax states), one per consumer warp group (see row_halves)."""
    ROWS: tl.constexpr = BLOCK_M // HALVES
    q_row, kv_row0, start_m, hi, offs_m0, offs_m1 = _query_block(
        S, H_Q, GROUP, BLOCK_M, ROWS, CAUSAL
    )
    offs_n0 = tl.arange(0, BLOCK_N)
    q0 = desc_q.load([q_row, 0])
    m0 = tl.full((ROWS,), float("-inf"), dtype=tl.float32)
    l0 = tl.zeros((ROWS,), dtype=tl.float32)
    acc0 = tl.zeros((ROWS, HEAD_DIM), dtype=tl.float32)
    if HALVES == 2:  # noqa: SIM108 (Triton: a constexpr branch)
        q1 = desc_q.load([q_row + ROWS, 0])
    else:
        q1 = q0  # unused: one tile
    m1, l1, acc1 = m0, l0, acc0
    qk_scale = sm_scale * LOG2E
    if SPLIT:
        lo_diag = start_m // BLOCK_N * BLOCK_N
        for start_n in tl.range(0, lo_diag, BLOCK_N, warp_specialize=WS):
            k = desc_k.load([kv_row0 + start_n, 0])
            v = desc_v.load([kv_row0 + start_n, 0])
            m0, l0, acc0, m1, l1, acc1 = _fwd_rows(
                q0, q1, k, v, m0, l0, acc0, m1, l1, acc1, qk_scale, offs_m0, offs_m1,
                start_n + offs_n0, False, HALVES,
            )  # fmt: skip
        for start_n in tl.range(lo_diag, hi, BLOCK_N):
            k = desc_k.load([kv_row0 + start_n, 0])
            v = desc_v.load([kv_row0 + start_n, 0])
            m0, l0, acc0, m1, l1, acc1 = _fwd_rows(
                q0, q1, k, v, m0, l0, acc0, m1, l1, acc1, qk_scale, offs_m0, offs_m1,
                start_n + offs_n0, CAUSAL, HALVES,
            )  # fmt: skip
    else:
        for start_n in tl.range(0, hi, BLOCK_N, warp_specialize=WS):
            k = desc_k.load([kv_row0 + start_n, 0])
            v = desc_v.load([kv_row0 + start_n, 0])
            m0, l0, acc0, m1, l1, acc1 = _fwd_rows(
                q0, q1, k, v, m0, l0, acc0, m1, l1, acc1, qk_scale, offs_m0, offs_m1,
                start_n + offs_n0, CAUSAL, HALVES,
            )  # fmt: skip
    _fwd_store(o_ptr, lse_ptr, acc0, m0, l0, q_row, HEAD_DIM, ROWS)
    if HALVES == 2:
        _fwd_store(o_ptr, lse_ptr, acc1, m1, l1, q_row + ROWS, HEAD_DIM, ROWS)


@triton.jit
def _dkdv_step(k, v, q, do, dk, dv, lse2, delta, qk_scale, offs_n, offs_m, CAUSAL: tl.constexpr):
    p_t = tl.math.exp2(tl.dot(k, q.T) * qk_scale - lse2[None, :])
    if CAUSAL:
        p_t = tl.where(offs_n[:, None] <= offs_m[None, :], p_t, 0.0)
    dv = tl.dot(p_t.to(do.dtype), do, dv)
    ds_t = p_t * (tl.dot(v, do.T) - delta[None, :])
    dk = tl.dot(ds_t.to(q.dtype), q, dk)
    return dk, dv


@triton.jit
def _dkdv_store(dk_ptr, dv_ptr, dk, dv, sm_scale, row0, HEAD_DIM: tl.constexpr,
                ROWS: tl.constexpr):  # fmt: skip
    offs_d = tl.arange(0, HEAD_DIM)
    ptrs = (row0 + tl.arange(0, ROWS)).to(tl.int64)[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(dk_ptr + ptrs, (dk * sm_scale).to(dk_ptr.dtype.element_ty))
    tl.store(dv_ptr + ptrs, dv.to(dv_ptr.dtype.element_ty))


@triton.jit
def dkdv_kernel(
    desc_q, desc_k, desc_v, desc_do, lse_ptr, delta_ptr, dk_ptr, dv_ptr, sm_scale, S, H_Q,
    GROUP, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, WS: tl.constexpr, HALVES: tl.constexpr,
):  # fmt: skip
    """One program per (key block, batch x KV head); one flat loop over the GQA group's
    query heads and the query blocks that see these keys. HALVES == 2: the BLOCK_N key rows
    as two halves (see row_halves)."""
    ROWS: tl.constexpr = BLOCK_N // HALVES
    pid_bkv = tl.program_id(1)
    h_kv = pid_bkv % (H_Q // GROUP)
    start_n = tl.program_id(0) * BLOCK_N
    offs_n0 = start_n + tl.arange(0, ROWS)
    offs_n1 = offs_n0 + ROWS
    kv_row = pid_bkv * S + start_n
    k0 = desc_k.load([kv_row, 0])
    v0 = desc_v.load([kv_row, 0])
    if HALVES == 2:
        k1 = desc_k.load([kv_row + ROWS, 0])
        v1 = desc_v.load([kv_row + ROWS, 0])
    else:
        k1, v1 = k0, v0  # unused: one tile
    qk_scale = sm_scale * LOG2E
    dk0 = tl.zeros((ROWS, HEAD_DIM), dtype=tl.float32)
    dv0 = tl.zeros((ROWS, HEAD_DIM), dtype=tl.float32)
    dk1, dv1 = dk0, dv0
    if CAUSAL:  # noqa: SIM108 (Triton: a constexpr branch)
        lo = start_n // BLOCK_M * BLOCK_M
    else:
        lo = 0
    n_blocks = (S - lo) // BLOCK_M
    row_h0 = ((pid_bkv // (H_Q // GROUP)) * H_Q + h_kv * GROUP) * S
    for i in tl.range(0, n_blocks * GROUP, warp_specialize=WS):
        g = i // n_blocks
        start_m = lo + (i - g * n_blocks) * BLOCK_M
        row = row_h0 + g * S + start_m
        q = desc_q.load([row, 0])
        do = desc_do.load([row, 0])
        offs_m = start_m + tl.arange(0, BLOCK_M)
        lse2 = tl.load(lse_ptr + row + tl.arange(0, BLOCK_M)) * LOG2E
        delta = tl.load(delta_ptr + row + tl.arange(0, BLOCK_M))
        dk0, dv0 = _dkdv_step(k0, v0, q, do, dk0, dv0, lse2, delta, qk_scale, offs_n0, offs_m,
                              CAUSAL)  # fmt: skip
        if HALVES == 2:
            dk1, dv1 = _dkdv_step(k1, v1, q, do, dk1, dv1, lse2, delta, qk_scale, offs_n1,
                                  offs_m, CAUSAL)  # fmt: skip
    _dkdv_store(dk_ptr, dv_ptr, dk0, dv0, sm_scale, kv_row, HEAD_DIM, ROWS)
    if HALVES == 2:
        _dkdv_store(dk_ptr, dv_ptr, dk1, dv1, sm_scale, kv_row + ROWS, HEAD_DIM, ROWS)


@triton.jit
def _dq_step(q, do, k, v, dq, lse2, delta, qk_scale, offs_m, offs_n, CAUSAL: tl.constexpr):
    p = tl.math.exp2(tl.dot(q, k.T) * qk_scale - lse2[:, None])
    if CAUSAL:
        p = tl.where(offs_n[None, :] <= offs_m[:, None], p, 0.0)
    ds = p * (tl.dot(do, v.T) - delta[:, None])
    return tl.dot(ds.to(k.dtype), k, dq)


@triton.jit
def _dq_store(dq_ptr, dq, sm_scale, row0, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr):
    offs_d = tl.arange(0, HEAD_DIM)
    ptrs = (row0 + tl.arange(0, ROWS)).to(tl.int64)[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(dq_ptr + ptrs, (dq * sm_scale).to(dq_ptr.dtype.element_ty))


@triton.jit
def dq_kernel(
    desc_q, desc_k, desc_v, desc_do, lse_ptr, delta_ptr, dq_ptr, sm_scale, S, H_Q, GROUP,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, WS: tl.constexpr, HALVES: tl.constexpr,
):  # fmt: skip
    """HALVES == 2: the BLOCK_M query rows as two halves (see row_halves)."""
    ROWS: tl.constexpr = BLOCK_M // HALVES
    row, kv_row0, _start_m, hi, offs_m0, offs_m1 = _query_block(
        S, H_Q, GROUP, BLOCK_M, ROWS, CAUSAL
    )
    rows0 = row + tl.arange(0, ROWS)
    q0 = desc_q.load([row, 0])
    do0 = desc_do.load([row, 0])
    lse2_0 = tl.load(lse_ptr + rows0) * LOG2E
    delta0 = tl.load(delta_ptr + rows0)
    if HALVES == 2:
        q1 = desc_q.load([row + ROWS, 0])
        do1 = desc_do.load([row + ROWS, 0])
        lse2_1 = tl.load(lse_ptr + rows0 + ROWS) * LOG2E
        delta1 = tl.load(delta_ptr + rows0 + ROWS)
    else:  # unused: one tile
        q1, do1, lse2_1, delta1 = q0, do0, lse2_0, delta0
    qk_scale = sm_scale * LOG2E
    dq0 = tl.zeros((ROWS, HEAD_DIM), dtype=tl.float32)
    dq1 = dq0
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in tl.range(0, hi, BLOCK_N, warp_specialize=WS):
        k = desc_k.load([kv_row0 + start_n, 0])
        v = desc_v.load([kv_row0 + start_n, 0])
        offs_n = start_n + offs_n0
        dq0 = _dq_step(q0, do0, k, v, dq0, lse2_0, delta0, qk_scale, offs_m0, offs_n, CAUSAL)
        if HALVES == 2:
            dq1 = _dq_step(q1, do1, k, v, dq1, lse2_1, delta1, qk_scale, offs_m1, offs_n, CAUSAL)
    _dq_store(dq_ptr, dq0, sm_scale, row, HEAD_DIM, ROWS)
    if HALVES == 2:
        _dq_store(dq_ptr, dq1, sm_scale, row + ROWS, HEAD_DIM, ROWS)


# --- compile only (CPU) -----------------------------------------------------------------


def row_halves(rows: int, ws: bool) -> int:
    """2 where a warp-specialised loop's two consumer warp groups split the program's rows
    (a 128-row tile: one 64-row half each), else 1. The kernel then loads and keeps the two
    halves apart (the same math per row): Triton 3.9's Hopper warp specialisation splits a
    128-row descriptor load into 64-row copies but keeps the 128-row descriptor ("descriptor
    block and tensor must have the same number of elements"), and a pointer load of the tile
    it refuses outright ("unsupported load type for producer commit")."""
    return 2 if ws and rows >= 128 else 1


def _signature(kernel: str, d: int, bm: int, bn: int, halves: int = 1) -> dict[str, str]:
    """The kernel's argument types; a descriptor of the rows the halves split holds one half."""
    q_rows = bm // halves if kernel in ("fwd", "dq") else bm
    kv_rows = bn // halves if kernel == "dkdv" else bn
    sig = {
        "desc_q": f"tensordesc<bf16[{q_rows},{d}]>",
        "desc_k": f"tensordesc<bf16[{kv_rows},{d}]>",
        "desc_v": f"tensordesc<bf16[{kv_rows},{d}]>",
    }
    if kernel == "fwd":
        sig.update({"o_ptr": "*bf16", "lse_ptr": "*fp32"})
    else:
        sig.update({"desc_do": f"tensordesc<bf16[{q_rows},{d}]>", "lse_ptr": "*fp32",
                    "delta_ptr": "*fp32"})  # fmt: skip
        sig.update(
            {"dk_ptr": "*bf16", "dv_ptr": "*bf16"} if kernel == "dkdv" else {"dq_ptr": "*bf16"}
        )
    sig.update({"sm_scale": "fp32", "S": "i32", "H_Q": "i32", "GROUP": "i32"})
    return sig


def _kernels(cfg: tuple[Any, ...]) -> list[tuple[str, Any, int, int, dict[str, Any]]]:
    """(name, kernel, BLOCK_M, BLOCK_N, extra constexprs) launched by one config."""
    if cfg[0] == "bwd":
        _, bm1, bn1, bm2, bn2, _stages, _warps, ws = cfg
        return [
            ("dkdv", dkdv_kernel, bm1, bn1, {"WS": ws, "HALVES": row_halves(bn1, ws)}),
            ("dq", dq_kernel, bm2, bn2, {"WS": ws, "HALVES": row_halves(bm2, ws)}),
        ]
    kind, bm, bn, _stages, _warps, ws = cfg
    extra = {"WS": ws, "SPLIT": kind == "fwd-split", "HALVES": row_halves(bm, ws)}
    return [("fwd", fwd_kernel, bm, bn, extra)]


def compile_only(cfg: tuple[Any, ...], d: int, causal: bool = True) -> dict[str, Any]:
    """Compile a config's kernels for sm_90 without a GPU: did the warp-specialised form
    come out, with how many warps and how much shared memory."""
    from triton.backends.compiler import GPUTarget

    stages, warps = (cfg[5], cfg[6]) if cfg[0] == "bwd" else (cfg[3], cfg[4])
    out: dict[str, Any] = {"status": "compiled"}
    for name, fn, bm, bn, extra in _kernels(cfg):
        constexprs = {"HEAD_DIM": d, "BLOCK_M": bm, "BLOCK_N": bn, "CAUSAL": causal, **extra}
        sig = {
            **_signature(name, d, bm, bn, extra["HALVES"]),
            **{k: "constexpr" for k in constexprs},
        }
        src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=constexprs)
        compiled = triton.compile(
            src,
            target=GPUTarget("cuda", 90, 32),
            options={"num_warps": warps, "num_stages": stages},
        )
        out[name] = {
            "warp_specialized": "ttg.warp_specialize(" in compiled.asm["ttgir"],
            "num_warps": compiled.metadata.num_warps,
            "shared_bytes": compiled.metadata.shared,
        }
    return out


# --- on the GPU (a child process) ----------------------------------------------------------


def _inputs(p: dict[str, Any]) -> tuple[Any, ...]:
    import torch

    gen = torch.Generator(device="cuda").manual_seed(0)
    b, hq, hkv, s, d = p["B"], p["Hq"], p["Hkv"], p["S"], p["D"]

    def rnd(h: int) -> Any:
        return torch.randn(b, h, s, d, generator=gen, device="cuda", dtype=torch.bfloat16)

    return rnd(hq), rnd(hkv), rnd(hkv), rnd(hq)  # q, k, v, do


def _sdpa(q: Any, k: Any, v: Any, causal: bool, backend: str) -> Any:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    which = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]
    with sdpa_kernel(which):
        if k.shape[1] != q.shape[1]:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def sdpa_reference(q: Any, k: Any, v: Any, do: Any, causal: bool) -> tuple[str, Any]:
    """(backend label, a function (q, k, v) -> o) for the fastest SDPA that runs: cuDNN with
    enable_gqa, cuDNN on K/V expanded to the query heads, then FlashAttention."""
    group = q.shape[1] // k.shape[1]
    tries = [("cudnn", False), ("cudnn", True), ("flash", False), ("flash", True)]
    for backend, expand in tries:
        if expand and group == 1:
            continue

        def fn(q: Any, k: Any, v: Any, backend: str = backend, expand: bool = expand) -> Any:
            if expand:
                k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
            return _sdpa(q, k, v, causal, backend)

        try:
            qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
            fn(qq, kk, vv).backward(do)
            return backend + ("-expanded" if expand else ""), fn
        except RuntimeError:
            continue
    raise RuntimeError("no SDPA backend (cuDNN, FlashAttention) runs this shape")


def _rel(a: Any, b: Any) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


def baseline_child(d: int, rep: int) -> None:
    """cuDNN SDPA and GRETA's shipped kernel, forward and forward + backward, per shape."""
    import torch

    import greta_core.torch  # noqa: F401

    for p in shapes(d):
        row: dict[str, Any] = {"shape": shape_label(p)}
        q, k, v, do = _inputs(p)
        try:
            label, fn = sdpa_reference(q, k, v, do, p["causal"])
            row["sdpa_backend"] = label
            row.update(_time_pair(fn, q, k, v, do, rep, "sdpa"))
            scale = 1.0 / math.sqrt(d)

            def greta(
                q: Any, k: Any, v: Any, causal: bool = p["causal"], scale: float = scale
            ) -> Any:
                return torch.ops.greta.attention(q, k, v, causal, scale)

            row.update(_time_pair(greta, q, k, v, do, rep, "greta"))
            row["status"] = "ok"
        except Exception as exc:
            row.update(status="failed", detail=f"{exc.__class__.__name__}: {exc}"[:240])
        print("RESULT " + json.dumps(row), flush=True)
        del q, k, v, do
        torch.cuda.empty_cache()


def _time_pair(fn: Any, q: Any, k: Any, v: Any, do: Any, rep: int, name: str) -> dict[str, float]:
    import torch
    from triton.testing import do_bench

    qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
    with torch.no_grad():
        fwd = do_bench(lambda: fn(q, k, v), rep=rep, return_mode="median")

    def both() -> None:
        fn(qq, kk, vv).backward(do)

    total = do_bench(both, rep=rep, grad_to_none=[qq, kk, vv], return_mode="median")
    return {f"{name}_fwd_ms": round(fwd, 4), f"{name}_total_ms": round(total, 4)}


def config_child(cfg: tuple[Any, ...], d: int, rep: int) -> None:
    """One config on every shape of this head_dim: a RESULT line per shape."""
    import torch
    from triton.tools.tensor_descriptor import TensorDescriptor

    def desc(t: Any, rows: int) -> Any:
        flat = t.reshape(-1, d)
        return TensorDescriptor(flat, list(flat.shape), list(flat.stride()), [rows, d])

    for p in shapes(d):
        row: dict[str, Any] = {"shape": shape_label(p)}
        try:
            row.update(_one_shape(cfg, p, rep, desc))
        except Exception as exc:  # a compile error (resources, a failed pass) or a bad launch
            kind = (
                "compile-error"
                if "Compil" in type(exc).__name__ or "resources" in str(exc)
                else "failed"
            )
            row.update(status=kind, detail=f"{exc.__class__.__name__}: {exc}"[:240])
        print("RESULT " + json.dumps(row), flush=True)
        torch.cuda.empty_cache()


def _one_shape(cfg: tuple[Any, ...], p: dict[str, Any], rep: int, desc: Any) -> dict[str, Any]:
    import torch
    from triton.testing import do_bench

    row: dict[str, Any] = {}
    b, hq, hkv, s, d = p["B"], p["Hq"], p["Hkv"], p["S"], p["D"]
    causal, scale, group = p["causal"], 1.0 / math.sqrt(d), hq // hkv
    q, k, v, do = _inputs(p)
    label, ref_fn = sdpa_reference(q, k, v, do, causal)
    row["sdpa_backend"] = label
    qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
    ref_o = ref_fn(qq, kk, vv)
    ref_o.backward(do)
    o = torch.empty_like(q)
    lse = torch.empty(b * hq * s, device="cuda", dtype=torch.float32)
    # The forward's o and lse feed the backward: backward configs make them with the
    # plain 64x64 forward (no WS), which ran on Triton 3.6 already.
    fwd_cfg = ("fwd", 64, 64, 3, 4, False) if cfg[0] == "bwd" else cfg
    _, fbm, fbn, fstages, fwarps, fws = fwd_cfg
    split, halves = fwd_cfg[0] == "fwd-split", row_halves(fbm, fws)

    def fwd() -> None:
        fwd_kernel[(s // fbm, b * hq)](
            desc(q, fbm // halves), desc(k, fbn), desc(v, fbn), o, lse, scale, s, hq, group,
            HEAD_DIM=d, BLOCK_M=fbm, BLOCK_N=fbn, CAUSAL=causal, SPLIT=split, WS=fws,
            HALVES=halves,
            num_warps=fwarps, num_stages=fstages,
        )  # fmt: skip

    print("launching", flush=True)  # the parent reads a hang from here on
    fwd()
    torch.cuda.synchronize()
    if cfg[0] != "bwd":
        row["rel_err"] = _rel(o, ref_o)
        if not row["rel_err"] <= MAX_REL:
            row["status"] = "wrong"
        else:
            row["ms"] = round(do_bench(fwd, rep=rep, return_mode="median"), 4)
            row["status"] = "ok"
        return row
    _, bm1, bn1, bm2, bn2, stages, warps, ws = cfg
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    h1, h2 = row_halves(bn1, ws), row_halves(bm2, ws)

    def bwd() -> None:
        delta = (o.float() * do.float()).sum(-1).reshape(-1)
        dkdv_kernel[(s // bn1, b * hkv)](
            desc(q, bm1), desc(k, bn1 // h1), desc(v, bn1 // h1), desc(do, bm1), lse, delta,
            dk, dv, scale, s, hq, group, HEAD_DIM=d, BLOCK_M=bm1, BLOCK_N=bn1, CAUSAL=causal,
            WS=ws, HALVES=h1, num_warps=warps, num_stages=stages,
        )  # fmt: skip
        dq_kernel[(s // bm2, b * hq)](
            desc(q, bm2 // h2), desc(k, bn2), desc(v, bn2), desc(do, bm2 // h2), lse, delta,
            dq, scale, s, hq, group, HEAD_DIM=d, BLOCK_M=bm2, BLOCK_N=bn2, CAUSAL=causal,
            WS=ws, HALVES=h2, num_warps=warps, num_stages=stages,
        )  # fmt: skip

    print("launching", flush=True)
    bwd()
    torch.cuda.synchronize()
    errs = {"dq": _rel(dq, qq.grad), "dk": _rel(dk, kk.grad), "dv": _rel(dv, vv.grad)}
    row["rel_err"], row["rel_errs"] = max(errs.values()), errs
    if not row["rel_err"] <= 2 * MAX_REL:  # gradients: two bf16 roundings more
        row["status"] = "wrong"
    else:
        row["ms"] = round(do_bench(bwd, rep=rep, return_mode="median"), 4)
        row["status"] = "ok"
    return row


# --- the parent ---------------------------------------------------------------------------


def classify(
    returncode: int | None, stdout: str, stderr: str, n_shapes: int
) -> list[dict[str, Any]]:
    """A child's rows: its RESULT lines, then one row for the shape it stopped at (hang,
    abort, compile error) and "not-run" for the shapes after it."""
    rows = [
        json.loads(ln[len("RESULT ") :]) for ln in stdout.splitlines() if ln.startswith("RESULT ")
    ]
    if len(rows) >= n_shapes:
        return rows
    if returncode is None:
        where = (
            "first launch and its compile, or a later launch"
            if stdout.rstrip().endswith("launching")
            else "set-up"
        )
        end = {"status": "hang", "detail": f"no result within the time limit ({where})"}
    else:
        lines = [ln for ln in stderr.splitlines() if "Assertion" in ln or "error:" in ln]
        compiler = bool(lines)
        if not lines:
            lines = [ln for ln in stderr.splitlines() if ln.strip()][-1:]
        detail = lines[0].strip()[:240] if lines else f"exit code {returncode}"
        # An abort in the compiler's passes, a crash after a launch, or anything else.
        status = "compile-error" if compiler else "crash" if "launching" in stdout else "failed"
        end = {"status": status, "detail": detail}
    rows.append({"index": len(rows), **end})
    rows += [{"index": i, "status": "not-run"} for i in range(len(rows), n_shapes)]
    return rows


def run_child(args: list[str], timeout_s: float) -> tuple[int | None, str, str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), *args]
    # A real compile: TRITON_INTERPRET=1 (set by the CPU tests, and by `greta install` on a
    # CPU-only machine) would hand triton.compile an interpreted function.
    env = {**os.environ, "TRITON_INTERPRET": "0",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout_s)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        return None, out, err


def summarize(baseline: list[dict[str, Any]], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per shape: the best passing forward and backward configs against cuDNN SDPA."""
    out = []
    for base in baseline:
        shape = base["shape"]
        s: dict[str, Any] = {"shape": shape, "sdpa_backend": base.get("sdpa_backend")}
        for kind in ("fwd", "bwd"):
            ok = [r for r in rows if r.get("shape") == shape and r.get("status") == "ok"
                  and r["config"].split()[0].startswith(kind)]  # fmt: skip
            if ok:
                best = min(ok, key=lambda r: r["ms"])
                s[f"best_{kind}"], s[f"best_{kind}_ms"] = best["config"], best["ms"]
        if "sdpa_total_ms" in base:
            s["sdpa_fwd_ms"], s["sdpa_total_ms"] = base["sdpa_fwd_ms"], base["sdpa_total_ms"]
            s["greta_total_ms"] = base.get("greta_total_ms")
            if s.get("greta_total_ms"):
                s["greta_vs_cudnn"] = round(base["sdpa_total_ms"] / base["greta_total_ms"], 3)
            if "best_fwd_ms" in s:
                s["ws_fwd_vs_cudnn"] = round(base["sdpa_fwd_ms"] / s["best_fwd_ms"], 3)
            if "best_fwd_ms" in s and "best_bwd_ms" in s:
                ws_total = s["best_fwd_ms"] + s["best_bwd_ms"]
                s["ws_vs_cudnn"] = round(base["sdpa_total_ms"] / ws_total, 3)
        out.append(s)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="JSON results (required on a GPU)")
    parser.add_argument("--d", type=int, choices=(64, 128), default=128, help="head_dim")
    parser.add_argument("--dry-run", action="store_true", help="compile for sm_90 only (CPU)")
    parser.add_argument("--rep", type=int, default=50, help="do_bench ms per timing")
    parser.add_argument("--timeout-s", type=float, default=75.0, help="per config (process)")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=380.0,
        help="start no config after this (one started may run --timeout-s more)",
    )
    parser.add_argument("--only", default="", help="e.g. fwd:0,bwd:1 (indices into the lists)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        if args.child == "baseline":
            baseline_child(args.d, args.rep)
        else:
            kind, index = args.child.split(":")
            cfg = CONFIGS[kind][int(index)]
            if args.dry_run:
                print("RESULT " + json.dumps(compile_only(cfg, args.d)), flush=True)
            else:
                config_child(cfg, args.d, args.rep)
        return 0
    if not args.dry_run and args.out is None:
        parser.error("--out is required unless --dry-run")
    picked = (
        [(k, int(i)) for k, i in (x.split(":") for x in args.only.split(","))]
        if args.only
        else [(k, i) for k in ("fwd", "bwd") for i in range(len(CONFIGS[k]))]
    )
    for kind, index in picked:
        if kind not in CONFIGS or not 0 <= index < len(CONFIGS[kind]):
            parser.error(f"--only {kind}:{index}: no such config")
    rows: list[dict[str, Any]] = []
    baseline: list[dict[str, Any]] = []
    start = time.monotonic()
    if args.dry_run:
        for kind, index in picked:
            cfg = CONFIGS[kind][index]
            # In a child: a real compile needs TRITON_INTERPRET=0, which run_child sets.
            code, out, err = run_child(["--child", f"{kind}:{index}", "--d", str(args.d), "--dry-run"],
                                       args.timeout_s)  # fmt: skip
            row = {"config": config_label(cfg), **classify(code, out, err, 1)[0]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    else:
        n = len(shapes(args.d))
        common = ["--d", str(args.d), "--rep", str(args.rep)]
        code, out, err = run_child(["--child", "baseline", *common], args.timeout_s * 2)
        baseline = classify(code, out, err, n)
        for i, r in enumerate(baseline):
            r.setdefault("shape", shape_label(shapes(args.d)[i]))
        for kind, index in picked:
            cfg = CONFIGS[kind][index]
            if time.monotonic() - start > args.budget_s:
                rows.append({"config": config_label(cfg), "status": "not-run", "detail": "budget"})
                continue
            t0 = time.monotonic()
            code, out, err = run_child(["--child", f"{kind}:{index}", *common], args.timeout_s)
            got = classify(code, out, err, n)
            for i, r in enumerate(got):
                r.setdefault("shape", shape_label(shapes(args.d)[i]))
                rows.append({"config": config_label(cfg), **r})
            status = [r["status"] for r in got]
            print(f"{config_label(cfg):44s} {time.monotonic() - t0:5.1f} s "
                  f"{status.count('ok')}/{n} ok {sorted(set(status))}", flush=True)  # fmt: skip
    summary = summarize(baseline, rows) if baseline else []
    if args.out is not None:
        import triton as _triton

        from greta_core.bench.metadata import header
        from greta_core.bench.report import write_json

        device = "cpu" if args.dry_run else "cuda"
        doc = {
            **header("attention_ws", device, "bench/attention_ws.py", argv, args.out),
            "triton": _triton.__version__, "head_dim": args.d, "max_rel": MAX_REL,
            "baseline": baseline, "rows": rows, "summary": summary,
        }  # fmt: skip
        write_json(args.out, doc)
    if summary:
        print(f"\n{'shape':34} {'sdpa':15} {'fwd/cudnn':>9} {'ws/cudnn':>8} {'greta/cudnn':>11}")
        for s in summary:
            print(f"{s['shape']:34} {s.get('sdpa_backend') or '-':15} "
                  f"{s.get('ws_fwd_vs_cudnn', math.nan):9.3f} {s.get('ws_vs_cudnn', math.nan):8.3f} "
                  f"{s.get('greta_vs_cudnn') or math.nan:11.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
