"""Host time of forward + backward per op, inputs requiring grad: GRETA vs PyTorch eager.

Issue 25's training target: for every op, ``torch.ops.greta.<op>`` forward and backward
together cost at most 1.5x the host time of the PyTorch eager op it replaces. The sibling of
``bench/binding_overhead.py`` (no-grad calls), with the same timing rule: every case gets
warm-up calls, then ``--rounds`` rounds each time every case once (a batch of ``--calls``
forward+backward calls, the device synchronised after each batch, outside the timed region),
in an order rotated each round; a case's time is the median over rounds and its ratio the
median of the per-round ratios to its vendor (interleaving keeps a drifting host out of it).

A call is ``torch.autograd.grad(op(*inputs), inputs, grad_outputs)``: the forward, the
autograd graph and the backward, with no gradient accumulated into ``.grad``. Inputs are
small (host-bound, as a small-batch training step's ops are).

    python bench/grad_overhead.py --out <out>/grad_overhead.json   # GPU, bf16
    python bench/grad_overhead.py --device cpu --tiny --out <tmp>/g.json  # a smoke run

Writes the JSON (metadata, per-case rows, ratios) and a CSV beside it (same stem). Ops
without a backward (kv_cache_append writes a cache in place) are listed as skipped.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

TARGET = 1.5  # issue 25: forward+backward host time per op within 1.5x PyTorch eager

# What a case is: inputs that require grad, the op, the gradients of its outputs.
Step = Callable[[], Any]


def _step(fn: Callable[..., Any], inputs: tuple[Any, ...], extra: tuple[Any, ...] = ()) -> Step:
    """One forward+backward of `fn(*inputs, *extra)` with respect to `inputs`."""
    import torch

    out = fn(*inputs, *extra)
    outs = out if isinstance(out, tuple) else (out,)
    grads = tuple(torch.ones_like(o) for o in outs)
    autograd_grad = torch.autograd.grad

    def step() -> Any:
        out = fn(*inputs, *extra)
        return autograd_grad(out if isinstance(out, tuple) else (out,), inputs, grads)

    return step


def cases(device: str, tiny: bool) -> list[tuple[str, str, str, Step | None, str]]:
    """(group, variant, case name, step or None, why not): each GRETA op beside the PyTorch
    eager op it stands for. A case this tree lacks is reported, not fatal."""
    import torch
    import torch.nn.functional as F

    import greta_core.torch  # noqa: F401  (registers torch.ops.greta)

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    n = 32 if tiny else 64
    g = torch.Generator().manual_seed(0)

    def t(*shape: int, grad: bool = True, scale: float = 1.0) -> Any:
        x = (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)
        return x.requires_grad_(grad)

    x, r, w, b = t(4, n), t(4, n), t(n), t(n)
    xr = t(1, 4, 2, n)  # rope: [B, S, H, D]
    cos, sin = t(4, n // 2, grad=False), t(4, n // 2, grad=False)
    a2, b2 = t(16, n), t(n, 32)
    q, k, v = (t(1, 2, 16, n) for _ in range(3))  # [B, H, S, D]
    hidden, lm = t(8, n), t(128, n, scale=0.1)
    target = torch.randint(0, 128, (8,), generator=g).to(device)
    eps = 1e-6

    def rotate_half(x: Any, cos: Any, sin: Any) -> Any:  # torch eager RoPE (HF models')
        x1, x2 = x.chunk(2, dim=-1)
        c, s = cos[None, :, None, :], sin[None, :, None, :]
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)

    def add_norm(x: Any, r: Any, w: Any, e: float) -> tuple[Any, Any]:
        s = x + r
        return F.rms_norm(s, (s.shape[-1],), w, e), s

    def lce(h: Any, w: Any, y: Any) -> Any:
        return F.cross_entropy((h @ w.T).float(), y)

    ops = torch.ops.greta
    # (group, vendor name, vendor fn, GRETA op name, inputs, non-differentiable extras):
    # both take (*inputs, *extras).
    table: list[tuple[str, str, Callable[..., Any], str, tuple[Any, ...], tuple[Any, ...]]] = [
        ("rms_norm", "F.rms_norm", lambda x, w, e: F.rms_norm(x, (n,), w, e), "rms_norm",
         (x, w), (eps,)),
        ("add_rms_norm", "x + r, F.rms_norm", add_norm, "add_rms_norm", (x, r, w), (eps,)),
        ("layer_norm", "F.layer_norm", lambda x, w, b, e: F.layer_norm(x, (n,), w, b, e),
         "layer_norm", (x, w, b), (1e-5,)),
        ("rope", "rotate-half RoPE (torch eager)", rotate_half, "rope",
         (xr,), (cos, sin)),
        ("swiglu", "F.silu(g) * u", lambda a, c: F.silu(a) * c, "swiglu", (x, r), ()),
        ("geglu", "F.gelu(g, tanh) * u", lambda a, c: F.gelu(a, approximate="tanh") * c,
         "geglu", (x, r), ()),
        ("softmax", "torch.softmax", lambda x: torch.softmax(x, -1), "softmax", (x,), ()),
        ("linear_cross_entropy", "F.cross_entropy(h @ W.T)", lce, "linear_cross_entropy",
         (hidden, lm), (target,)),
        ("attention", "F.scaled_dot_product_attention",
         lambda q, k, v, c: F.scaled_dot_product_attention(q, k, v, is_causal=c), "attention",
         (q, k, v), (True,)),
        ("matmul", "torch.matmul", torch.matmul, "matmul", (a2, b2), ()),
    ]  # fmt: skip
    out: list[tuple[str, str, str, Step | None, str]] = []
    for group, vendor_name, vendor, op, inputs, extra in table:
        out.append((group, "vendor", vendor_name, _try(vendor, inputs, extra), ""))
        if not hasattr(ops, op):
            out.append((group, "torch.ops.greta", f"torch.ops.greta.{op}", None,
                        "not in this tree"))  # fmt: skip
            continue
        out.append((group, "torch.ops.greta", f"torch.ops.greta.{op}",
                    _try(getattr(ops, op), inputs, extra), ""))  # fmt: skip
    if device == "cuda" or hasattr(ops, "kv_cache_append"):
        out.append(("kv_cache", "torch.ops.greta", "torch.ops.greta.kv_cache_append", None,
                    "no backward: an in-place cache write"))  # fmt: skip
    return out


def _try(fn: Callable[..., Any], inputs: tuple[Any, ...], extra: tuple[Any, ...]) -> Any:
    try:
        return _step(fn, inputs, extra)
    except Exception as exc:  # an op this tree or device cannot run: say so, go on
        return exc


def _sync(device: str) -> Callable[[], None]:
    import torch

    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def interleaved_host_us(
    fns: dict[Any, Step], calls: int, rounds: int, warmup: int, sync: Callable[[], None]
) -> dict[Any, list[float]]:
    """Per case, its host time per call in each round (see the module docstring)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    sync()
    names = list(fns)
    out: dict[Any, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        k = r % len(names) if names else 0
        for name in names[k:] + names[:k]:
            fn = fns[name]
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            out[name].append((time.perf_counter() - start) / calls * 1e6)
            sync()
    return out


def ratios(per_round: dict[tuple[str, str], list[float]]) -> dict[str, float]:
    """Per group: the median over rounds of GRETA's time over the vendor's in that round."""
    out = {}
    for (group, variant), times in per_round.items():
        vendor = per_round.get((group, "vendor"))
        if variant == "torch.ops.greta" and vendor:
            per = [t / v for t, v in zip(times, vendor, strict=True)]
            out[group] = round(statistics.median(per), 3)
    return out


CSV_FIELDS = ("group", "variant", "case", "host_us_per_call", "host_us_min", "ratio_to_vendor",
              "within_target", "skipped")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file (a CSV beside it)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--label", default="greta", help="name of this run (e.g. the tree)")
    parser.add_argument("--calls", type=int, default=200, help="calls per case and round")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (a smoke run)")
    parser.add_argument("--cpu", type=int, help="pin this process to one CPU core")
    args = parser.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})

    from greta_core.bench.metadata import collect

    rows: list[dict[str, Any]] = []
    runnable: dict[tuple[str, str], Step] = {}
    sync = _sync(args.device)
    for group, variant, name, step, why in cases(args.device, args.tiny):
        row: dict[str, Any] = {"group": group, "variant": variant, "case": name}
        if isinstance(step, Exception):
            row["skipped"] = f"{type(step).__name__}: {step}"[:200]
        elif step is None:
            row["skipped"] = why
        else:
            try:
                step()
                sync()
                runnable[(group, variant)] = step
            except Exception as exc:  # recorded; the others still run
                row["skipped"] = f"{type(exc).__name__}: {exc}"[:200]
        rows.append(row)
    per_round = interleaved_host_us(runnable, args.calls, args.rounds, args.warmup, sync)
    by_group = ratios(per_round)
    for row in rows:
        times = per_round.get((row["group"], row["variant"]))
        if times:
            row["host_us_per_call"] = round(statistics.median(times), 2)
            row["host_us_min"] = round(min(times), 2)
        if row["variant"] == "torch.ops.greta" and row["group"] in by_group:
            row["ratio_to_vendor"] = by_group[row["group"]]
            row["within_target"] = by_group[row["group"]] <= TARGET
    doc = {
        "label": args.label,
        **collect("grad_overhead", args.device),
        "device": args.device,
        "tiny": args.tiny,
        "calls": args.calls,
        "rounds": args.rounds,
        "warmup": args.warmup,
        "cpu": args.cpu,
        "target": TARGET,
        "results": rows,
        "greta_vs_vendor": by_group,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    with args.out.with_suffix(".csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, CSV_FIELDS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: row.get(k, "") for k in CSV_FIELDS})
    for row in rows:
        value = row.get("host_us_per_call")
        shown = f"{value:9.1f} us/fwd+bwd" if value is not None else f"skipped: {row['skipped']}"
        print(f"{row['case']:42} {shown}")
    print(f"fwd+bwd host time / PyTorch eager's, median of {args.rounds} rounds "
          f"(target <= {TARGET}):")  # fmt: skip
    for group, ratio in by_group.items():
        print(f"  {group:22} {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
