"""Check and time GRETA's GEMM and attention kernels against the vendor paths, in one run.

Run on a GPU machine from the repository root::

    PYTHONUNBUFFERED=1 python3 bench/tune_matmul_attention.py [--quick] [--out DIR]

Prints the measured ceilings, correctness (relative error against a float64 reference),
and a table of candidate configs (median of ``triton.testing.do_bench``, rotating input
sets, random data) beside ``torch.matmul`` (cuBLAS) and every available
``F.scaled_dot_product_attention`` backend. Writes the full numbers as JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import triton
from triton.testing import do_bench

from greta_core.kernels.attention import attention_fwd_kernel
from greta_core.kernels.matmul import matmul_kernel
from greta_core.ops import attention as attn_ops
from greta_core.ops import matmul as mm_ops

ROWS: list[dict[str, Any]] = []


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    if torch.isnan(out).any():
        return float("nan")
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def bench(fn: Any, rep: int = 200) -> float:
    return float(do_bench(fn, warmup=25, rep=rep, return_mode="median"))


def ceilings() -> None:
    n = 1 << 28  # 512 MiB of bf16 each way
    x = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x))
    print(f"copy: {2 * x.numel() * 2 / ms / 1e9:.2f} TB/s (read+write)")
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    ms = bench(lambda: a @ b)
    print(f"torch.matmul 8192^3 bf16: {2 * 8192**3 / ms / 1e9:.0f} TFLOP/s")


# ---------------------------------------------------------------- GEMM


def launch_mm(a, b, bias, out, cfg: dict[str, int]) -> None:
    m, k = a.shape
    n = b.shape[1]
    matmul_kernel[(triton.cdiv(m, cfg["BM"]) * triton.cdiv(n, cfg["BN"]),)](
        a, b, bias if bias is not None else a, m, n, k,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1),
        out,
        BLOCK_M=cfg["BM"], BLOCK_N=cfg["BN"], BLOCK_K=cfg["BK"], GROUP_M=cfg.get("G", 8),
        HAS_BIAS=bias is not None, EVEN_K=k % cfg["BK"] == 0, INT64=False, UPCAST=False,
        num_warps=cfg["w"], num_stages=cfg["s"],
    )  # fmt: skip


def check_matmul() -> None:
    cases = [
        (1000, 777, 1333, False, False, torch.bfloat16),
        (4096, 4096, 4096, False, False, torch.bfloat16),
        (517, 1029, 4103, True, True, torch.float16),
        (7, 4096, 4096, True, False, torch.bfloat16),
        (3, 50, 70, False, True, torch.float16),
    ]
    for m, n, k, bias_on, b_t, dtype in cases:
        a = torch.randn(m, k, device="cuda", dtype=dtype)
        b = (
            torch.randn(n, k, device="cuda", dtype=dtype).t()
            if b_t
            else torch.randn(k, n, device="cuda", dtype=dtype)
        )
        bias = torch.randn(n, device="cuda", dtype=dtype) if bias_on else None
        out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
        mm_ops.matmul(a, b, bias, out=out)
        torch.cuda.synchronize()
        ref = a.double() @ b.double() + (bias.double() if bias_on else 0)
        err = rel_err(out, ref)
        ok = err < (8e-3 if dtype == torch.bfloat16 else 1e-3)
        print(f"check matmul {m}x{n}x{k} bias={bias_on} bT={b_t} {dtype}: rel err {err:.2e} "
              f"{'OK' if ok else 'FAIL'}")  # fmt: skip


def time_matmul(size: int, dtype: torch.dtype, configs: list[dict[str, int]]) -> None:
    sets = 4 if size <= 4096 else 1
    mats = [
        (
            torch.randn(size, size, device="cuda", dtype=dtype),
            torch.randn(size, size, device="cuda", dtype=dtype),
        )
        for _ in range(sets)
    ]
    out = torch.empty(size, size, device="cuda", dtype=dtype)
    flops = 2 * size**3
    it = [0]

    def nxt() -> tuple[torch.Tensor, torch.Tensor]:
        it[0] = (it[0] + 1) % sets
        return mats[it[0]]

    def vendor() -> None:
        a, b = nxt()
        torch.matmul(a, b, out=out)

    ms_ref = bench(vendor)
    tf_ref = flops / ms_ref / 1e9
    print(f"  torch.matmul {size}^3 {dtype}: {ms_ref:.3f} ms {tf_ref:.0f} TFLOP/s")
    ROWS.append({"op": "matmul", "size": size, "dtype": str(dtype), "impl": "cublas",
                 "ms": ms_ref, "tflops": tf_ref})  # fmt: skip
    for cfg in configs:

        def mine(cfg: dict[str, int] = cfg) -> None:
            a, b = nxt()
            launch_mm(a, b, None, out, cfg)

        try:
            ms = bench(mine)
        except Exception as exc:  # out of shared memory etc.
            print(f"  {cfg}: failed {type(exc).__name__}: {str(exc)[:120]}")
            continue
        tf = flops / ms / 1e9
        print(f"  greta {cfg}: {ms:.3f} ms {tf:.0f} TFLOP/s ratio {ms_ref / ms:.3f}")
        ROWS.append({"op": "matmul", "size": size, "dtype": str(dtype), "impl": "greta",
                     "cfg": cfg, "ms": ms, "tflops": tf, "ratio": ms_ref / ms})  # fmt: skip
    # The table's own pick, through the public launcher.
    ms = bench(lambda: mm_ops.matmul(*nxt(), out=out))
    print(f"  greta table pick: {ms:.3f} ms {flops / ms / 1e9:.0f} TFLOP/s "
          f"ratio {ms_ref / ms:.3f}")  # fmt: skip
    ROWS.append({"op": "matmul", "size": size, "dtype": str(dtype), "impl": "greta-table",
                 "ms": ms, "tflops": flops / ms / 1e9, "ratio": ms_ref / ms})  # fmt: skip


# ---------------------------------------------------------------- attention


def attn_reference(q, k, v, causal, scale, q_lens=None, kv_lens=None):
    bsz, hq, sq, _ = q.shape
    skv = k.shape[2]
    group = hq // k.shape[1]
    k = k.double().repeat_interleave(group, 1)
    v = v.double().repeat_interleave(group, 1)
    s = (q.double() @ k.transpose(-1, -2)) * scale
    dev = q.device
    ql = q_lens.long() if q_lens is not None else torch.full((bsz,), sq, device=dev)
    kl = kv_lens.long() if kv_lens is not None else torch.full((bsz,), skv, device=dev)
    i = torch.arange(sq, device=dev)
    j = torch.arange(skv, device=dev)
    pos = (kl - ql)[:, None] + i[None]
    vis = (j[None, None] < kl[:, None, None]) & (i[None, :, None] < ql[:, None, None])
    if causal:
        vis = vis & (j[None, None] <= pos[:, :, None])
    s = s.masked_fill(~vis[:, None], -math.inf)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    return p @ v, lse


def check_attention() -> None:
    cases = [
        (2, 8, 8, 1000, 1000, 128, True, None),
        (2, 8, 2, 777, 777, 64, False, None),
        (3, 8, 2, 513, 513, 128, True, ([513, 200, 7], [513, 200, 7])),
        (3, 8, 2, 1, 1000, 128, True, ([1, 1, 1], [1000, 333, 1])),
        (2, 4, 4, 100, 900, 64, True, ([100, 37], [900, 400])),
    ]
    for bsz, hq, hkv, sq, skv, d, causal, lens in cases:
        for dtype in (torch.bfloat16, torch.float16):
            q = torch.randn(bsz, hq, sq, d, device="cuda", dtype=dtype)
            k = torch.randn(bsz, hkv, skv, d, device="cuda", dtype=dtype)
            v = torch.randn(bsz, hkv, skv, d, device="cuda", dtype=dtype)
            ql = kl = None
            if lens:
                ql = torch.tensor(lens[0], device="cuda", dtype=torch.int32)
                kl = torch.tensor(lens[1], device="cuda", dtype=torch.int32)
            o, lse = attn_ops.attention_with_lse(q, k, v, causal, None, ql, kl)
            ro, rl = attn_reference(q, k, v, causal, 1 / math.sqrt(d), ql, kl)
            err = rel_err(o, ro)
            fin = torch.isfinite(rl)
            lse_ok = bool((torch.isfinite(lse) == fin).all()) and (
                (lse.double()[fin] - rl[fin]).abs().max().item() < 1e-3
            )
            ok = err < 1e-2 and lse_ok
            print(f"check attention B{bsz} H{hq}/{hkv} S{sq}/{skv} D{d} causal={causal} "
                  f"lens={bool(lens)} {dtype}: rel err {err:.2e} lse_ok={lse_ok} "
                  f"{'OK' if ok else 'FAIL'}")  # fmt: skip


def launch_attn(q, k, v, out, lse, causal, cfg):
    bsz, hq, sq, d = q.shape
    attention_fwd_kernel[(triton.cdiv(sq, cfg["BM"]), bsz * hq)](
        q, k, v, q, q, 1 / math.sqrt(d), sq, k.shape[2], hq, hq // k.shape[1],
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
        out, lse,
        HEAD_DIM=d, BLOCK_M=cfg["BM"], BLOCK_N=cfg["BN"], CAUSAL=causal, HAS_LENS=False,
        UPCAST=False, num_warps=cfg["w"], num_stages=cfg["s"],
    )  # fmt: skip


def time_attention(bsz, h, s, d, causal, configs) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dtype = torch.bfloat16
    q = torch.randn(bsz, h, s, d, device="cuda", dtype=dtype)
    k = torch.randn(bsz, h, s, d, device="cuda", dtype=dtype)
    v = torch.randn(bsz, h, s, d, device="cuda", dtype=dtype)
    out = torch.empty_like(q)
    lse = torch.empty(bsz, h, s, device="cuda", dtype=torch.float32)
    flops = 4 * bsz * h * s * s * d // (2 if causal else 1)
    tag = f"B{bsz} H{h} S{s} D{d} causal={causal}"
    best = math.inf
    for name, backend in (
        ("flash", SDPBackend.FLASH_ATTENTION),
        ("cudnn", SDPBackend.CUDNN_ATTENTION),
        ("efficient", SDPBackend.EFFICIENT_ATTENTION),
    ):
        try:
            with sdpa_kernel(backend):
                fn = lambda: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
                    q, k, v, is_causal=causal
                )
                fn()
                ms = bench(fn, rep=300)
        except Exception as exc:
            print(f"  sdpa {name}: unavailable ({type(exc).__name__}: {str(exc)[:80]})")
            continue
        best = min(best, ms)
        print(f"  sdpa {name} {tag}: {ms:.3f} ms {flops / ms / 1e9:.0f} TFLOP/s")
        ROWS.append({"op": "attention", "shape": tag, "impl": f"sdpa-{name}", "ms": ms,
                     "tflops": flops / ms / 1e9})  # fmt: skip
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    for cfg in configs:
        try:
            launch_attn(q, k, v, out, lse, causal, cfg)
            err = rel_err(out, ref.float())
            ms = bench(lambda cfg=cfg: launch_attn(q, k, v, out, lse, causal, cfg), rep=300)
        except Exception as exc:
            print(f"  {cfg}: failed {type(exc).__name__}: {str(exc)[:120]}")
            continue
        print(f"  greta {cfg}: {ms:.3f} ms {flops / ms / 1e9:.0f} TFLOP/s "
              f"ratio-vs-best {best / ms:.3f} (err vs sdpa {err:.1e})")  # fmt: skip
        ROWS.append({"op": "attention", "shape": tag, "impl": "greta", "cfg": cfg, "ms": ms,
                     "tflops": flops / ms / 1e9, "ratio": best / ms})  # fmt: skip
    ms = bench(lambda: attn_ops.attention(q, k, v, causal), rep=300)
    print(f"  greta table pick: {ms:.3f} ms {flops / ms / 1e9:.0f} TFLOP/s "
          f"ratio-vs-best {best / ms:.3f}")  # fmt: skip
    ROWS.append({"op": "attention", "shape": tag, "impl": "greta-table", "ms": ms,
                 "tflops": flops / ms / 1e9, "ratio": best / ms})  # fmt: skip


MM_CONFIGS = [
    {"BM": 128, "BN": 256, "BK": 64, "w": 8, "s": 3},
    {"BM": 128, "BN": 256, "BK": 64, "w": 8, "s": 3, "G": 16},
    {"BM": 128, "BN": 256, "BK": 64, "w": 8, "s": 4},
    {"BM": 256, "BN": 128, "BK": 64, "w": 8, "s": 3},
    {"BM": 128, "BN": 128, "BK": 64, "w": 4, "s": 4},
    {"BM": 128, "BN": 128, "BK": 64, "w": 8, "s": 4},
]
ATTN_CONFIGS = [
    {"BM": 128, "BN": 64, "w": 8, "s": 3},
    {"BM": 128, "BN": 128, "w": 8, "s": 3},
    {"BM": 128, "BN": 64, "w": 4, "s": 3},
    {"BM": 128, "BN": 128, "w": 8, "s": 2},
    {"BM": 64, "BN": 64, "w": 4, "s": 3},
    {"BM": 128, "BN": 64, "w": 8, "s": 4},
    {"BM": 64, "BN": 128, "w": 4, "s": 3},
]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer configs")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--skip", default="", help="comma list: ceil,check,mm,attn")
    args = parser.parse_args()
    skip = set(args.skip.split(","))
    t0 = time.time()
    props = torch.cuda.get_device_properties(0)
    meta = {
        "gpu": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
        "triton": triton.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }  # fmt: skip
    print(meta)
    if "ceil" not in skip:
        ceilings()
    if "check" not in skip:
        check_matmul()
        check_attention()
    mm_cfgs = MM_CONFIGS[:2] if args.quick else MM_CONFIGS
    at_cfgs = ATTN_CONFIGS[:2] if args.quick else ATTN_CONFIGS
    if "mm" not in skip:
        for size in (4096, 8192):
            print(f"matmul {size}^3 bf16")
            time_matmul(size, torch.bfloat16, mm_cfgs)
        print("matmul 4096^3 fp16")
        time_matmul(4096, torch.float16, mm_cfgs[:1])
    if "attn" not in skip:
        print("attention")
        time_attention(4, 32, 4096, 128, True, at_cfgs)
        time_attention(4, 32, 4096, 64, True, ATTN_CONFIGS[:2])
        time_attention(4, 32, 4096, 128, False, ATTN_CONFIGS[:2])
    out = Path(args.out) / "tune_matmul_attention.json"
    out.write_text(json.dumps({"meta": meta, "rows": ROWS}, indent=1, default=str))
    print(f"done in {time.time() - t0:.0f} s; wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
