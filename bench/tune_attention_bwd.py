"""Sweep the Triton attention-backward tiles on this GPU: each kernel (dkdv, dq) separately,
the other at its current default; every candidate's gradients are checked against the
default's before it is timed (``triton.testing.do_bench``, median). Writes JSON.

    python bench/tune_attention_bwd.py --out bench/results/h100/tune_attention_bwd.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any

SHAPES = [(4, 32, 8, 2048, 128, True), (4, 32, 32, 4096, 64, True)]
DKDV = [
    {"BLOCK_M": m, "BLOCK_N": n, "num_warps": w, "num_stages": st}
    for m, n, w, st in itertools.product((32, 64), (64, 128), (4, 8), (1, 2, 3))
]
DQ = [
    {"BLOCK_M": m, "BLOCK_N": n, "num_warps": w, "num_stages": st}
    for m, n, w, st in itertools.product((64, 128), (32, 64), (4, 8), (1, 2, 3))
]


def tune_shape(shape: tuple, arch: str) -> list[dict[str, Any]]:
    import torch
    from triton.testing import do_bench

    from greta_core.ops import attention_bwd as bwd
    from greta_core.ops.attention import attention_with_lse

    b, hq, hkv, s, d, causal = shape
    q = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16)
    do = torch.randn_like(q)
    o, lse = attention_with_lse(q, k, v, causal)
    default = bwd.kernel_configs(arch, d)

    # The gradients come in q's dtype, dq shaped like q and dk/dv like k and v.
    bufs = [
        torch.empty(shape, device="cuda", dtype=q.dtype) for shape in (q.shape, k.shape, v.shape)
    ]

    def launch(configs: tuple[dict, dict]) -> None:
        bwd.launch(do, q, k, v, o, lse, causal, None, *bufs, arch, configs=configs)

    def run(configs: tuple[dict, dict]) -> list:
        launch(configs)
        return [t.float() for t in bufs]

    want = run(default)
    rows: list[dict[str, Any]] = []
    for which, space in (("dkdv", DKDV), ("dq", DQ)):
        for cand in space:
            configs = (cand, default[1]) if which == "dkdv" else (default[0], cand)
            row: dict[str, Any] = {"shape": list(shape), "kernel": which, "config": cand}
            try:
                got = run(configs)
                err = max(
                    ((g - w).norm() / w.norm()).item() for g, w in zip(got, want, strict=True)
                )
                row["max_rel_diff_vs_default"] = round(err, 6)
                # bf16 gradients: another tile's summation order flips some roundings by one
                # ulp (2^-8 relative); a wrong config is off by O(1).
                if not err < 5e-3:
                    row["error"] = "gradients differ from the default config's"
                else:
                    row["ms_total"] = round(
                        do_bench(
                            lambda c=configs: launch(c), warmup=25, rep=150, return_mode="median"
                        ),
                        4,
                    )
            except Exception as exc:  # out of shared memory, compile errors
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            rows.append(row)
    default_ms = do_bench(lambda: launch(default), warmup=25, rep=150, return_mode="median")
    best = {}
    for which in ("dkdv", "dq"):
        ok = [r for r in rows if r["kernel"] == which and "ms_total" in r]
        best[which] = min(ok, key=lambda r: r["ms_total"]) if ok else None
    print(json.dumps({"shape": list(shape), "default_ms": round(default_ms, 4), "best": best}))
    rows.append({"shape": list(shape), "kernel": "default", "config": default,
                 "ms_total": round(default_ms, 4)})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    from greta_core.arch import device_arch
    from greta_core.bench.metadata import collect

    arch = device_arch()
    results = [row for shape in SHAPES for row in tune_shape(shape, arch)]
    meta = {
        **collect("tune_attention_bwd", "cuda"),
        "note": "ms_total = delta + dkdv + dq launches into preallocated bf16 gradients,"
        " one kernel varied",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"metadata": meta, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
