"""Host time per call of GRETA's bindings on a tiny input, next to a trivial Triton launch.

Run it once per source tree with a ``--label`` into the same ``--out`` file to compare two
versions side by side in one session (runs are appended, with metadata):

    PYTHONPATH=old python bench/binding_overhead.py --label before --out overhead.json
    PYTHONPATH=.   python bench/binding_overhead.py --label after  --out overhead.json

Each GRETA op is timed beside the PyTorch eager op it replaces (vendor), through
``torch.ops.greta`` and the raw API, on decode-sized inputs (no tensor requires grad; grad
mode stays on, as in a user's eager call), with the ratio to the vendor's time (issue 13's
target: at most 1.5x). Timing follows ``bench/interleaved.py`` (shared with
``bench/grad_overhead.py``): every case gets 200 warm-up calls, then ``--rounds`` rounds of
``--calls`` calls per case, interleaved; a case's time is the median over rounds, its ratio
the median of the per-round ratios to the vendor. ``--cpu N`` pins the process to one core.
Cases the tree under test lacks are recorded as skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling interleaved.py
from interleaved import (
    add_times,
    interleaved_host_us,
    print_cases,
    ratios_to_vendor,
    runnable_cases,
)

# (group, variant, case name): each GRETA op beside the PyTorch eager op it stands for.
# The rms_norm / vec_add / softmax names are those of earlier runs (comparable across runs).
Case = tuple[str, str, str]


def cases() -> list[tuple[Case, Callable[[], Any] | None, str]]:
    """((group, variant, name), call or None, why not) per case; a case the tree under test
    lacks (an older GRETA run side by side) is reported, not fatal."""
    import torch
    import torch.nn.functional as F
    import triton
    import triton.language as tl

    import greta_core.torch  # noqa: F401  (registers torch.ops.greta)
    from greta_core import raw

    @triton.jit
    def trivial(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)

    dev, bf16 = "cuda", torch.bfloat16
    x = torch.randn(4, 64, device=dev, dtype=bf16)
    r = torch.randn(4, 64, device=dev, dtype=bf16)
    w = torch.randn(64, device=dev, dtype=bf16)
    b = torch.randn(64, device=dev, dtype=bf16)
    t = torch.randn(256, device=dev)
    a2, b2 = (
        torch.randn(16, 64, device=dev, dtype=bf16),
        torch.randn(64, 32, device=dev, dtype=bf16),
    )
    q = torch.randn(1, 8, 1, 64, device=dev, dtype=bf16)  # a decode step: one query token
    kv = torch.randn(1, 8, 128, 64, device=dev, dtype=bf16)
    # A 1B Llama's decode step (32 query heads over 8 KV heads, 512 cached tokens).
    q_gqa = torch.randn(1, 32, 1, 64, device=dev, dtype=bf16)
    k_gqa, v_gqa = (torch.randn(1, 8, 512, 64, device=dev, dtype=bf16) for _ in range(2))
    xr = torch.randn(1, 1, 8, 64, device=dev, dtype=bf16)  # rope: [B, S, H, D]
    cos, sin = (
        torch.randn(1, 32, device=dev, dtype=bf16),
        torch.randn(1, 32, device=dev, dtype=bf16),
    )

    def rotate_half(x, cos, sin):  # torch eager RoPE (what HF models run)
        x1, x2 = x.chunk(2, dim=-1)
        c, s = cos[None, :, None, :], sin[None, :, None, :]
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)

    def sdpa_gqa():  # SDPA repeats no KV heads itself with enable_gqa (torch >= 2.5)
        return F.scaled_dot_product_attention(q_gqa, k_gqa, v_gqa, enable_gqa=True)

    ops = torch.ops.greta
    groups: list[tuple[str, str, Callable[[], Any], str, Callable[[], Any]]] = [
        # (group, vendor name, vendor call, GRETA op name, raw call)
        ("vec_add", "torch.add (vendor)", lambda: torch.add(x, x), "vec_add",
         lambda: raw.vec_add(x, x)),
        ("rms_norm", "F.rms_norm (vendor)", lambda: F.rms_norm(x, (64,), w, 1e-6), "rms_norm",
         lambda: raw.rms_norm(x, w, 1e-6)),
        ("layer_norm", "F.layer_norm (vendor)", lambda: F.layer_norm(x, (64,), w, b, 1e-5),
         "layer_norm", lambda: raw.layer_norm(x, w, b, 1e-5)),
        ("softmax", "torch.softmax (vendor)", lambda: torch.softmax(x, -1), "softmax",
         lambda: raw.softmax(x)),
        ("add_rms_norm", "x + r, F.rms_norm (vendor)",
         lambda: F.rms_norm(x + r, (64,), w, 1e-6), "add_rms_norm",
         lambda: raw.add_rms_norm(x, r, w, 1e-6)),
        ("swiglu", "F.silu(g) * u (vendor)", lambda: F.silu(x) * r, "swiglu",
         lambda: raw.swiglu(x, r)),
        ("rope", "rotate-half RoPE (torch eager)", lambda: rotate_half(xr, cos, sin), "rope",
         lambda: raw.rope(xr, cos, sin)),
        ("matmul", "torch.matmul (vendor)", lambda: torch.matmul(a2, b2), "matmul",
         lambda: raw.matmul(a2, b2)),
        ("attention", "F.scaled_dot_product_attention (vendor)",
         lambda: F.scaled_dot_product_attention(q, kv, kv), "attention",
         lambda: raw.attention(q, kv, kv)),
        ("attention_gqa_decode", "F.scaled_dot_product_attention(enable_gqa) (vendor)",
         sdpa_gqa, "attention", lambda: raw.attention(q_gqa, k_gqa, v_gqa)),
    ]  # fmt: skip
    greta_args = {  # per group: torch.ops.greta's arguments
        "vec_add": (x, x), "rms_norm": (x, w, 1e-6), "layer_norm": (x, w, b, 1e-5),
        "softmax": (x,), "add_rms_norm": (x, r, w, 1e-6), "swiglu": (x, r),
        "rope": (xr, cos, sin), "matmul": (a2, b2), "attention": (q, kv, kv),
        "attention_gqa_decode": (q_gqa, k_gqa, v_gqa, False),
    }  # fmt: skip
    out: list[tuple[Case, Callable[[], Any] | None, str]] = [
        (
            ("triton", "trivial", "trivial Triton launch"),
            lambda: trivial[(1,)](t, 256, BLOCK=256),
            "",
        )
    ]
    for group, vendor_name, vendor, op, raw_call in groups:
        out.append(((group, "vendor", vendor_name), vendor, ""))
        op_call = _op_call(ops, op, greta_args[group]) if hasattr(ops, op) else None
        why = "" if op_call else "not in this tree"
        shape = "" if group == op else f" ({group})"  # a second shape of one op
        out.append(((group, "torch.ops.greta", f"torch.ops.greta.{op}{shape}"), op_call, why))
        name = f"greta_core.raw.{op}{shape}"
        if hasattr(raw, op):
            out.append(((group, "raw", name), raw_call, ""))
        else:
            out.append(((group, "raw", name), None, "not in this tree"))
    return out


TARGET = 1.5  # issue 13: every torch.ops.greta op within 1.5x of its PyTorch eager op


def _op_call(ops: Any, op: str, args: tuple[Any, ...]) -> Callable[[], Any]:
    fn = getattr(ops, op)
    return lambda: fn(*args)


def host_us(fn: Callable[[], Any], calls: int) -> float:
    """One case alone: 200 warm-up calls, then the minimum over 5 batches of `calls` calls
    (GPU synchronised after each batch, untimed); host_path_breakdown's rule."""
    import torch

    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", required=True, help="name of this run (e.g. the tree)")
    parser.add_argument("--out", type=Path, required=True, help="JSON file; runs are appended")
    parser.add_argument("--calls", type=int, default=1000, help="calls per case and round")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--cpu", type=int, help="pin this process to one CPU core")
    args = parser.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    import torch

    import greta_core
    from greta_core.bench.metadata import collect

    rows, runnable = runnable_cases(
        (({"case": name, "group": group, "variant": variant}, fn, why)
         for (group, variant, name), fn, why in cases()),
        torch.cuda.synchronize,
    )  # fmt: skip
    per_round = interleaved_host_us(runnable, args.calls, args.rounds, 200, torch.cuda.synchronize)
    add_times(rows, per_round)
    ratios = ratios_to_vendor(per_round, ("torch.ops.greta", "raw"), 2)
    run = {
        "label": args.label,
        "greta_core": str(Path(greta_core.__file__).parent.parent.name),
        **collect("binding_overhead", "cuda"),
        "calls": args.calls,
        "rounds": args.rounds,
        "cpu": args.cpu,
        "results": rows,
        "greta_vs_vendor": ratios,
    }
    doc = json.loads(args.out.read_text()) if args.out.is_file() else {"runs": []}
    doc["runs"].append(run)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print_cases(rows, "{:8.1f} us/call", f"{args.label:8} ")
    print(f"{args.label:8} host time per call / vendor's, median of {args.rounds} rounds "
          f"(target <= {TARGET}):")  # fmt: skip
    for group, by in ratios.items():
        print(f"{args.label:8}   {group:14} " + "  ".join(f"{v}={r:.2f}x" for v, r in by.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
