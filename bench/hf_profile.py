#!/usr/bin/env python3
"""Where one HF grid cell's training step spends its device time, variant by variant.

``bench/hf_grid.py`` says which variant is faster in a cell; this says why: for each
variant, one model of the family (the grid's builder: same weights, same patching), a few
warm-up steps, then ``torch.profiler`` over ``--steps`` steps. Per variant it records the
wall time per step, the device time per step (the sum of the kernels' own time: on a
GPU-bound step about the wall time, on a host-bound one less) and the kernels that took
most of it, each with its time and launches per step.

    python bench/hf_profile.py --family gemma --regime train-b4s2048 --out DIR   # GPU
    python bench/hf_profile.py --tiny --out DIR                                  # CPU check

Writes ``<out>/hf_profile.json`` (metadata, per variant: wall and device ms per step, the
top kernels) and ``hf_profile.csv`` (a row per variant and kernel).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling hf_grid.py
from hf_grid import (
    FAMILIES,
    REGIMES,
    TINY_REGIMES,
    build,
    grid_device,
    grid_metadata,
    parse_names,
    revert_all,
    train_step,
)

FIELDS = ("variant", "kernel", "ms_per_step", "launches_per_step", "share")
VARIANTS = ("vanilla", "compile", "liger", "greta")


def profile_variant(
    family: str, variant: str, regime_name: str, device: str, tiny: bool, warmup: int,
    steps: int, top: int, compile_backend: str,
) -> dict[str, Any]:  # fmt: skip
    """One variant's step: wall and device ms per step, its `top` kernels. GRETA's patches
    (the family's RoPE is patched for the whole family) are undone after it, so the next
    variant in this process runs without them."""
    try:
        return _profile(family, variant, regime_name, device, tiny, warmup, steps, top,
                        compile_backend)  # fmt: skip
    finally:
        revert_all()


def _profile(
    family: str, variant: str, regime_name: str, device: str, tiny: bool, warmup: int,
    steps: int, top: int, compile_backend: str,
) -> dict[str, Any]:  # fmt: skip
    import torch
    from torch.profiler import ProfilerActivity, profile

    regime = (TINY_REGIMES if tiny else REGIMES)[regime_name]
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    base = "vanilla" if variant == "compile" else variant
    model = build(FAMILIES[family], base, device, dtype, tiny)
    trainer = (
        torch.compile(model, backend=compile_backend, dynamic=False)
        if variant == "compile" else model
    )  # fmt: skip
    step = train_step(model, trainer, regime, device)

    for _ in range(warmup):
        step()
    walls = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        walls.append((time.perf_counter() - t0) * 1e3)
    gpu = device == "cuda"
    activities = [ProfilerActivity.CUDA] if gpu else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
    events = prof.key_averages()

    def own(e: Any) -> float:  # microseconds of the event itself, summed over its calls
        return e.self_device_time_total if gpu else e.self_cpu_time_total

    total = sum(own(e) for e in events)
    kernels = sorted((e for e in events if own(e) > 0), key=own, reverse=True)[:top]
    out = {
        "variant": variant, "wall_ms_per_step": statistics.median(walls),
        "device_ms_per_step": total / steps / 1e3, "clock": "device" if gpu else "cpu",
        "kernels": [
            {"kernel": e.key, "ms_per_step": own(e) / steps / 1e3,
             "launches_per_step": e.count / steps, "share": own(e) / total if total else 0.0}
            for e in kernels
        ],
    }  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="result folder")
    parser.add_argument("--family", default="gemma", choices=list(FAMILIES))
    parser.add_argument("--regime", default="train-b4s2048",
                        choices=[r for r in REGIMES if r.startswith("train")])  # fmt: skip
    parser.add_argument("--variants", default="greta,compile")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2, help="steps timed, then profiled")
    parser.add_argument("--top", type=int, default=25, help="kernels kept per variant")
    parser.add_argument("--tiny", action="store_true", help="CPU format check (tiny config)")
    args = parser.parse_args(argv)
    variants = parse_names(args.variants, VARIANTS, "variant", parser, flag="--variants")
    if min(args.steps, args.top) < 1 or args.warmup < 0:
        parser.error("--steps and --top must be >= 1, --warmup >= 0")

    from greta_core.bench.metadata import command_line
    from greta_core.bench.report import write_csv, write_json

    device = grid_device(args.tiny)
    meta = grid_metadata("hf_profile", device)
    backend = "eager" if args.tiny else "inductor"
    results = []
    for variant in variants:
        r = profile_variant(args.family, variant, args.regime, device, args.tiny, args.warmup,
                            args.steps, args.top, backend)  # fmt: skip
        results.append(r)
        print(f"{variant:8s} wall {r['wall_ms_per_step']:8.2f} ms/step, {r['clock']} "
              f"{r['device_ms_per_step']:8.2f} ms/step", flush=True)  # fmt: skip
        for k in r["kernels"][:8]:
            print(
                f"    {k['ms_per_step']:8.2f} ms {k['launches_per_step']:6.1f}x  {k['kernel'][:90]}"
            )
    command = command_line("bench/hf_profile.py", sys.argv[1:] if argv is None else argv,
                           args.out / "x")  # fmt: skip
    doc = {"metadata": meta, "command": command, "family": args.family, "regime": args.regime,
           "results": results}  # fmt: skip
    write_json(args.out / "hf_profile.json", doc)
    rows = [{"variant": r["variant"], **k} for r in results for k in r["kernels"]]
    write_csv(args.out / "hf_profile.csv", rows, FIELDS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
