#!/usr/bin/env python3
"""Experiment: a one-kernel attention backward that adds dq with TMA bulk reductions.

GRETA's backward (``greta_core/kernels/attention_bwd.py``) is two kernels and seven block
products per (query block, key block) pair: the dq kernel recomputes p and dp. SDPA's
backward on Hopper makes five, adding each pair's share of dq into an fp32 buffer. An
earlier GRETA variant did that with element-wise ``tl.atomic_add`` and was slower. This
script measures the same five-product kernel with its dq shares added by the tensor
memory accelerator (``tensor_descriptor.atomic_add``: one bulk reduction per tile, issued
asynchronously), beside the element-wise atomics, GRETA's two-kernel backward and SDPA's
backward, on the issue-13 MHA shapes (B4 H32 causal, bf16). Backward only: the forward's
output and logsumexp come from GRETA's forward, outside the timed region.

It is an experiment, not a GRETA op: MHA only, contiguous [B, H, S, D], S a multiple of
the tiles, CUDA with TMA (sm_90+); nothing in greta_core uses it.

    python3 bench/attention_bwd_tma_reduce.py --out bench/results/h100/attention_bwd_tma_reduce.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import triton
import triton.language as tl


@triton.jit
def _pairs(
    dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_acc, row0, start_n, lo, hi,
    qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q = tl.load(q_base + offs_m[:, None] * HEAD_DIM + offs_d[None, :])
        do = tl.load(do_base + offs_m[:, None] * HEAD_DIM + offs_d[None, :])
        lse2 = tl.load(lse_base + offs_m) * 1.4426950408889634
        delta = tl.load(delta_base + offs_m)
        p_t = tl.math.exp2(tl.dot(k, tl.trans(q)) * qk_scale - lse2[None, :])
        if MASKED:
            p_t = tl.where(offs_n[:, None] <= offs_m[None, :], p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv)
        dp_t = tl.dot(v, tl.trans(do))
        ds_t = (p_t * (dp_t - delta[None, :])).to(q.dtype)
        dk = tl.dot(ds_t, q, dk)
        dq = tl.dot(tl.trans(ds_t), k) * sm_scale
        if TMA:
            dq_acc.atomic_add([row0 + start_m, 0], dq)
        else:
            tl.atomic_add(dq_acc + (row0 + offs_m)[:, None] * HEAD_DIM + offs_d[None, :], dq)
    return dk, dv


@triton.jit
def bwd_one_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_acc, dk_ptr, dv_ptr, sm_scale, S,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    """One program per (key block, batch x head): dk, dv stored; dq shares added into the
    fp32 ``dq_acc`` [B*H*S, D] (a TensorDescriptor with TMA, else a pointer)."""
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    start_n = pid_n * BLOCK_N
    row0 = pid_bh * S
    base = pid_bh.to(tl.int64) * S * HEAD_DIM
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    tile = base + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    k = tl.load(k_ptr + tile)
    v = tl.load(v_ptr + tile)
    qk_scale = sm_scale * 1.4426950408889634
    dk = tl.zeros((BLOCK_N, HEAD_DIM), dtype=tl.float32)
    dv = tl.zeros((BLOCK_N, HEAD_DIM), dtype=tl.float32)
    lo = start_n // BLOCK_M * BLOCK_M
    mid = tl.minimum((start_n + BLOCK_N + BLOCK_M - 1) // BLOCK_M * BLOCK_M, S)
    q_base, do_base = q_ptr + base, do_ptr + base
    lse_base, delta_base = lse_ptr + row0, delta_ptr + row0
    dk, dv = _pairs(
        dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_acc, row0, start_n, lo, mid,
        qk_scale, sm_scale, HEAD_DIM, BLOCK_M, BLOCK_N, True, TMA,
    )  # fmt: skip
    dk, dv = _pairs(
        dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_acc, row0, start_n, mid, S,
        qk_scale, sm_scale, HEAD_DIM, BLOCK_M, BLOCK_N, False, TMA,
    )  # fmt: skip
    tl.store(dk_ptr + tile, (dk * sm_scale).to(dk_ptr.dtype.element_ty))
    tl.store(dv_ptr + tile, dv.to(dv_ptr.dtype.element_ty))


def one_kernel_bwd(q, k, v, o, lse, do, cfg: dict[str, int], tma: bool) -> tuple[Any, Any, Any]:
    import torch
    from triton.tools.tensor_descriptor import TensorDescriptor

    b, h, s, d = q.shape
    scale = d**-0.5
    delta = (o.float() * do.float()).sum(-1)
    dq_acc = torch.zeros((b * h * s, d), device=q.device, dtype=torch.float32)
    acc = TensorDescriptor(dq_acc, [b * h * s, d], [d, 1], [cfg["BLOCK_M"], d]) if tma else dq_acc
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    bwd_one_kernel[(s // cfg["BLOCK_N"], b * h)](
        q, k, v, do, lse, delta, acc, dk, dv, scale, s, HEAD_DIM=d, BLOCK_M=cfg["BLOCK_M"],
        BLOCK_N=cfg["BLOCK_N"], TMA=tma, num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
    )  # fmt: skip
    return dq_acc.view(b, h, s, d).to(q.dtype), dk, dv


CONFIGS = [
    {"BLOCK_M": m, "BLOCK_N": n, "num_warps": w, "num_stages": st}
    for m, n, w, st in itertools.product((32, 64), (64, 128), (4, 8), (2, 3))
    if not (w == 8 and n == 64)
]
SHAPES = [(4, 32, 2048, 128), (4, 32, 4096, 128), (4, 32, 2048, 64), (4, 32, 4096, 64)]


def _rel(a: Any, b: Any) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def measure_shape(shape: tuple[int, int, int, int], rep: int) -> dict[str, Any]:
    """Backward times of one shape: GRETA's two kernels, SDPA, and the one-kernel variants
    at their best config (each config checked against GRETA's gradients first)."""
    import torch
    import torch.nn.functional as F

    from greta_core.ops import attention, attention_bwd

    def bench(fn: Any) -> float:
        return triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median")

    b, h, s, d = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(b, h, s, d, device="cuda", generator=g, dtype=torch.bfloat16)
                   for _ in range(4))  # fmt: skip
    o, lse = attention.attention_with_lse(q, k, v, causal=True)
    row: dict[str, Any] = {"shape": f"B{b} H{h} S{s} D{d} causal", "failed": [], "rejected": []}
    ref = attention_bwd.attention_bwd(do, q, k, v, o, lse, causal=True)
    row["greta_two_kernel_ms"] = bench(
        lambda: attention_bwd.attention_bwd(do, q, k, v, o, lse, causal=True)
    )
    qs, ks, vs = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
    row["sdpa_bwd_ms"] = bench(
        lambda: torch.autograd.grad(out, (qs, ks, vs), do, retain_graph=True)
    )
    row["two_kernel_vs_sdpa"] = round(row["sdpa_bwd_ms"] / row["greta_two_kernel_ms"], 3)
    for tma in (True, False):
        name = "tma_reduce" if tma else "elementwise_atomics"
        best = None
        for cfg in CONFIGS:
            try:
                got = one_kernel_bwd(q, k, v, o, lse, do, cfg, tma)
                err = max(_rel(x, y) for x, y in zip(got, ref, strict=True))
                if not err < 2e-2:
                    row["rejected"].append([name, cfg, err])
                    continue
                t = bench(lambda cfg=cfg, tma=tma: one_kernel_bwd(q, k, v, o, lse, do, cfg, tma))
            except Exception as exc:  # a config that does not compile or fit
                row["failed"].append([name, cfg, f"{type(exc).__name__}: {exc}"[:200]])
                continue
            if best is None or t < best[0]:
                best = (t, cfg, err)
        if best is not None:
            row[f"{name}_ms"], row[f"{name}_config"], row[f"{name}_rel_err"] = best
            row[f"{name}_vs_two_kernel"] = round(row["greta_two_kernel_ms"] / best[0], 3)
            row[f"{name}_vs_sdpa"] = round(row["sdpa_bwd_ms"] / best[0], 3)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rep", type=int, default=100, help="do_bench ms")
    args = parser.parse_args(argv)

    from greta_core.bench.metadata import header
    from greta_core.bench.report import write_json

    rows = []
    for shape in SHAPES:
        rows.append(measure_shape(shape, args.rep))
        shown = {k: v for k, v in rows[-1].items() if k not in ("failed", "rejected")}
        print(json.dumps(shown), f"failed {len(rows[-1]['failed'])}", flush=True)
    doc = {
        **header("attention_bwd_tma_reduce", "cuda", "bench/attention_bwd_tma_reduce.py",
                 argv, args.out),
        "rows": rows,
    }  # fmt: skip
    write_json(args.out, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
