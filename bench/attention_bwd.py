"""Attention forward + backward (one training step's attention) on the GPU, side by side:

- ``greta``: ``torch.ops.greta.attention`` (Triton forward, Triton FlashAttention-2 backward);
- ``greta-reference-bwd``: the same op given full-length ``q_lens``/``kv_lens``, which keeps
  the torch-ops reference backward (the path every call took before the Triton backward);
- ``sdpa``: ``F.scaled_dot_product_attention`` with PyTorch's default backend choice.

Each case first checks the three sets of gradients against SDPA run on fp32 copies
(‖got − ref‖ / ‖ref‖), then times fwd+bwd with ``triton.testing.do_bench`` (median, events,
grads reset between runs) and records peak memory. Writes JSON with metadata.

    python bench/attention_bwd.py --out bench/results/h100/attention_bwd.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

CASES = [
    # (B, Hq, Hkv, S, D, causal)
    (4, 32, 32, 2048, 128, True),
    (4, 32, 8, 2048, 128, True),
    (4, 32, 32, 4096, 64, True),
    (4, 32, 32, 2048, 128, False),
]


def run_case(case: tuple[int, ...], impls: list[str]) -> list[dict[str, Any]]:
    import torch
    import torch.nn.functional as F
    from triton.testing import do_bench

    import greta_core.torch  # noqa: F401

    b, hq, hkv, s, d, causal = case
    dev, dt = "cuda", torch.bfloat16
    q = torch.randn(b, hq, s, d, device=dev, dtype=dt)
    k = torch.randn(b, hkv, s, d, device=dev, dtype=dt)
    v = torch.randn(b, hkv, s, d, device=dev, dtype=dt)
    do = torch.randn_like(q)
    full = torch.full((b,), s, dtype=torch.int32, device=dev)
    group = hq // hkv

    def sdpa(a: Any, kk: Any, vv: Any) -> Any:
        if group > 1:
            kk, vv = kk.repeat_interleave(group, 1), vv.repeat_interleave(group, 1)
        return F.scaled_dot_product_attention(a, kk, vv, is_causal=causal)

    fns = {
        "greta": lambda a, kk, vv: torch.ops.greta.attention(a, kk, vv, causal),
        "greta-reference-bwd": lambda a, kk, vv: torch.ops.greta.attention(
            a, kk, vv, causal, None, full, full
        ),
        "sdpa": sdpa,
    }
    leaves_ref = [t.detach().float().requires_grad_() for t in (q, k, v)]
    sdpa(*leaves_ref).backward(do.float())
    ref = [t.grad for t in leaves_ref]
    del leaves_ref
    flops = 4 * b * hq * s * s * d * (0.5 if causal else 1.0) * 3.5  # fwd + 2.5x bwd
    rows = []
    for name in impls:
        fn = fns[name]
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        row: dict[str, Any] = {"impl": name, "B": b, "Hq": hq, "Hkv": hkv, "S": s, "D": d,
                               "causal": causal}  # fmt: skip
        try:
            fn(*leaves).backward(do)
            row["rel_err"] = [
                round(((t.grad.float() - r).norm() / r.norm()).item(), 5)
                for t, r in zip(leaves, ref, strict=True)
            ]
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()

            def step(fn: Any = fn, leaves: list = leaves) -> None:
                fn(*leaves).backward(do)

            ms = do_bench(step, warmup=100, rep=500, grad_to_none=leaves, return_mode="median")
            row["ms"] = round(ms, 4)
            row["tflops"] = round(flops / ms / 1e9, 1)
            row["peak_extra_mib"] = round((torch.cuda.max_memory_allocated() - base) / 2**20, 1)
        except torch.cuda.OutOfMemoryError as exc:
            row["error"] = f"out of memory: {str(exc).splitlines()[0][:120]}"
            torch.cuda.empty_cache()
        rows.append(row)
        print(json.dumps(row), flush=True)
        del leaves
        torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--impls", default="greta,greta-reference-bwd,sdpa")
    args = parser.parse_args(argv)
    import torch
    import triton

    impls = [i.strip() for i in args.impls.split(",") if i.strip()]
    rows = [row for case in CASES for row in run_case(case, impls)]
    meta = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "dtype": "bfloat16",
        "flops": "4*B*Hq*S^2*D (x0.5 causal) x 3.5 (forward + backward)",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"metadata": meta, "results": rows}, indent=1) + "\n")
    print(f"{'impl':22} {'case':28} {'ms':>9} {'TFLOP/s':>8} {'extra MiB':>10}  rel_err")
    for r in rows:
        case = (
            f"B{r['B']} H{r['Hq']}/{r['Hkv']} S{r['S']} D{r['D']}{' causal' if r['causal'] else ''}"
        )
        if "error" in r:
            print(f"{r['impl']:22} {case:28} {r['error']}")
        else:
            print(f"{r['impl']:22} {case:28} {r['ms']:9.3f} {r['tflops']:8.1f} "
                  f"{r['peak_extra_mib']:10.1f}  {r['rel_err']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
