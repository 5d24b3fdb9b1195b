#!/usr/bin/env python3
"""The HF grid's host-bound training cell, GRETA against vanilla interleaved in one process.

A batch 1 x 256-token training step is 10-40 ms of mostly host time, and between two
processes of ``bench/hf_grid.py`` (one per variant) each variant's step moves by up to 30%
(``bench/results/h200/hf_grid/README.md``, Mistral: 1.34x, then 0.78x, on one machine).
Here one model per family is timed in rounds on the same weights: ``--steps`` synchronised
steps vanilla, then ``apply_greta`` and as many steps GRETA, then ``revert_greta`` (the
family's RoPE too), the order alternating per round, so a drift of the machine reaches both
variants alike. A variant's time is its median step; the ratio (vanilla / GRETA: above 1,
GRETA is faster) is the median of the per-round ratios, with the per-round spread beside it.

    python bench/hf_host_ab.py --out DIR                      # GPU: every family, bf16
    python bench/hf_host_ab.py --tiny --out DIR               # CPU format check (seconds)

Writes ``<out>/hf_host_ab.json`` (metadata with the stack versions, per-round times) and
``hf_host_ab.csv`` (a row per family).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling hf_grid.py
from hf_grid import FAMILIES, build, tokens

FIELDS = (
    "family", "batch", "seq", "rounds", "steps", "vanilla_ms", "greta_ms",
    "greta_vs_vanilla", "ratio_min", "ratio_max", "loss_rel_err",
)  # fmt: skip


def run_family(
    name: str, device: str, tiny: bool, batch: int, seq: int, rounds: int, steps: int,
    warmup: int,
) -> dict[str, Any]:  # fmt: skip
    """One family's interleaved rounds: its row, with the per-round times."""
    import torch

    from greta_core.transformers import apply_greta, revert_greta

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = build(FAMILIES[name], "vanilla", device, dtype, tiny)
    model.train()
    ids = tokens(model.config.vocab_size, batch, seq, 2, device)

    def step() -> float:
        out = model(ids, labels=ids)
        out.loss.backward()
        model.zero_grad(set_to_none=True)
        return out.loss.item()  # synchronises: each step is timed whole

    def timed(greta: bool) -> tuple[list[float], float]:
        patched = apply_greta(model) if greta else None
        try:
            for _ in range(warmup):
                loss = step()
            times = []
            for _ in range(steps):
                t0 = time.perf_counter()
                loss = step()
                times.append((time.perf_counter() - t0) * 1e3)
            return times, loss
        finally:
            if patched is not None:
                revert_greta(model)
                revert_greta(patched.family)

    per_round: list[dict[str, float]] = []
    losses: dict[bool, float] = {}
    for r in range(rounds):
        ms: dict[bool, float] = {}
        for greta in (False, True) if r % 2 == 0 else (True, False):
            times, losses[greta] = timed(greta)
            ms[greta] = statistics.median(times)
        per_round.append({"vanilla_ms": ms[False], "greta_ms": ms[True]})
    ratios = [x["vanilla_ms"] / x["greta_ms"] for x in per_round]
    return {
        "family": name, "batch": batch, "seq": seq, "rounds": rounds, "steps": steps,
        "vanilla_ms": statistics.median(x["vanilla_ms"] for x in per_round),
        "greta_ms": statistics.median(x["greta_ms"] for x in per_round),
        "greta_vs_vanilla": statistics.median(ratios),
        "ratio_min": min(ratios), "ratio_max": max(ratios),
        "loss_rel_err": abs(losses[True] - losses[False]) / abs(losses[False]),
        "per_round": per_round,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="result folder")
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=8, help="timed steps per variant and round")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps after each switch")
    parser.add_argument("--tiny", action="store_true", help="CPU format check (tiny configs)")
    args = parser.parse_args(argv)
    families = [f for f in args.families.split(",") if f]
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        parser.error(f"unknown family {', '.join(unknown)}; expected some of {', '.join(FAMILIES)}")
    if min(args.batch, args.seq, args.rounds, args.steps) < 1 or args.warmup < 0:
        parser.error("--batch, --seq, --rounds and --steps must be >= 1, --warmup >= 0")

    import torch

    from greta_core.bench.metadata import collect, command_line
    from greta_core.bench.report import write_csv, write_json

    device = "cpu" if args.tiny or not torch.cuda.is_available() else "cuda"
    seq = min(args.seq, 16) if args.tiny else args.seq
    meta = collect("hf_host_ab", device)
    with contextlib.suppress(Exception):
        from importlib.metadata import version

        meta["versions"]["transformers"] = version("transformers")
    rows = []
    for name in families:
        row = run_family(name, device, args.tiny, args.batch, seq, args.rounds, args.steps,
                         args.warmup)  # fmt: skip
        rows.append(row)
        print(f"{name:8s} vanilla {row['vanilla_ms']:8.2f} ms  greta {row['greta_ms']:8.2f} ms  "
              f"greta/vanilla speed {row['greta_vs_vanilla']:.2f}x "
              f"(rounds {row['ratio_min']:.2f}-{row['ratio_max']:.2f})", flush=True)  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    command = command_line("bench/hf_host_ab.py", sys.argv[1:] if argv is None else argv,
                           args.out / "x")  # fmt: skip
    write_json(args.out / "hf_host_ab.json", {"metadata": meta, "command": command, "rows": rows})
    write_csv(args.out / "hf_host_ab.csv", rows, FIELDS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
