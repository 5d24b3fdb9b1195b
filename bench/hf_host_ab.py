#!/usr/bin/env python3
"""The HF grid's host-bound cells, GRETA against vanilla interleaved in one process.

A batch-1 training step of 256 tokens is 10-40 ms of mostly host time, and an eager decode
of batch 1 is host-bound token by token. Between two processes of ``bench/hf_grid.py`` (one
per variant) such a cell moves by up to 30% (``bench/results/h200/hf_grid/README.md``,
Mistral's training step: 1.34x, then 0.78x, on one machine). Here one model per family is
timed in rounds on the same weights: ``--steps`` timed calls vanilla, then ``apply_greta``
and as many calls GRETA, then ``revert_greta`` (the family's RoPE too), the order
alternating per round, so a drift of the machine reaches both variants alike. A call is a
training step (forward with labels, backward) or a greedy ``generate`` of the regime's new
tokens (dynamic cache). A variant's time is its median call; the ratio (GRETA's speed over
vanilla's: above 1, GRETA is faster) is the median of the per-round ratios, with their range.

    python bench/hf_host_ab.py --out DIR                      # GPU: every family, bf16
    python bench/hf_host_ab.py --regimes decode-b1 --out DIR  # the grid's eager decode cell
    python bench/hf_host_ab.py --tiny --out DIR               # CPU format check (seconds)

Writes ``<out>/hf_host_ab.json`` (metadata with the stack versions, per-round times) and
``hf_host_ab.csv`` (a row per family and regime). Where ``<out>`` holds a grid
(``bench/hf_grid.py --out`` the same folder), its summary is recomputed: a host-bound
cell's verdict against vanilla then reads this ratio (``greta_vs_vanilla_interleaved``).
``--append`` keeps the cells of an earlier run in ``<out>`` that this one does not measure
(refused, before anything runs, where that run was on another GPU or torch/Triton).
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
    INTERLEAVED,
    REGIMES,
    TINY_REGIMES,
    Regime,
    build,
    generate_kwargs,
    grid_device,
    grid_metadata,
    host_cell,
    parse_names,
    resummarize,
    tokens,
    train_step,
)

# The grid's host-bound regimes this bench takes.
HOST_REGIMES = ("train-b1s256", "decode-b1", "decode-b8")

FIELDS = (
    "family", "regime", "batch", "seq", "new_tokens", "rounds", "steps", "vanilla_ms",
    "greta_ms", "vanilla_tok_s", "greta_tok_s", "greta_vs_vanilla", "ratio_min", "ratio_max",
    "loss_rel_err",
)  # fmt: skip


def _call(model: Any, regime: Regime, device: str) -> Any:
    """One timed call of `regime` (the grid's own step or generate), returning what the
    agreement compares; the model put in that call's mode."""
    import torch

    if regime.kind == "train":
        return train_step(model, model, regime, device)
    model.eval()
    prompt = tokens(model.config.vocab_size, regime.batch, regime.seq, 3, device)
    kw = generate_kwargs(regime, "greta")  # eager in both forms (no compiled variant here)

    def generate() -> Any:
        with torch.no_grad():
            out = model.generate(prompt, **kw)
        return out[:, prompt.shape[1] :].cpu()  # synchronises

    return generate


def run_regime(
    name: str, model: Any, regime: Regime, device: str, rounds: int, steps: int, warmup: int
) -> dict[str, Any]:
    """Family `name`'s interleaved rounds in one regime: its row, with the per-round times."""
    from greta_core.transformers import apply_greta, revert_greta

    call = _call(model, regime, device)

    def timed(greta: bool) -> tuple[list[float], Any]:
        patched = apply_greta(model) if greta else None
        try:
            for _ in range(warmup):
                result = call()
            times = []
            for _ in range(steps):
                t0 = time.perf_counter()
                result = call()
                times.append((time.perf_counter() - t0) * 1e3)
            return times, result
        finally:
            if patched is not None:
                revert_greta(model)
                revert_greta(patched.family)

    per_round: list[dict[str, float]] = []
    results: dict[bool, Any] = {}
    for r in range(rounds):
        ms: dict[bool, float] = {}
        for greta in (False, True) if r % 2 == 0 else (True, False):
            times, results[greta] = timed(greta)
            ms[greta] = statistics.median(times)
        per_round.append({"vanilla_ms": ms[False], "greta_ms": ms[True]})
    ratios = [x["vanilla_ms"] / x["greta_ms"] for x in per_round]
    row = {
        "family": name, "regime": regime.name, "batch": regime.batch, "seq": regime.seq,
        "new_tokens": regime.new_tokens, "rounds": rounds, "steps": steps,
        "vanilla_ms": statistics.median(x["vanilla_ms"] for x in per_round),
        "greta_ms": statistics.median(x["greta_ms"] for x in per_round),
        "greta_vs_vanilla": statistics.median(ratios),
        "ratio_min": min(ratios), "ratio_max": max(ratios), "per_round": per_round,
    }  # fmt: skip
    if regime.kind == "train":
        row["loss_rel_err"] = abs(results[True] - results[False]) / abs(results[False])
    else:
        generated = regime.batch * regime.new_tokens
        for variant in ("vanilla", "greta"):
            row[f"{variant}_tok_s"] = generated / (row[f"{variant}_ms"] / 1e3)
        # Greedy tokens of random-init bf16 models part ways after a near-tie: a count.
        row["tokens_equal"] = int((results[True] == results[False]).sum())
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="result folder")
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--regimes", default="train-b1s256", help=f"of {', '.join(HOST_REGIMES)}")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=8, help="timed calls per variant and round")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls after each switch")
    parser.add_argument("--tiny", action="store_true", help="CPU format check (tiny configs)")
    parser.add_argument(
        "--append", action="store_true",
        help="keep --out's earlier cells that this run does not measure (same GPU and stack)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    families = parse_names(args.families, FAMILIES, "family", parser)
    regimes = parse_names(args.regimes, HOST_REGIMES, "regime", parser, flag="--regimes")
    if min(args.rounds, args.steps) < 1 or args.warmup < 0:
        parser.error("--rounds and --steps must be >= 1, --warmup >= 0")

    import torch

    from greta_core.bench.metadata import command_line
    from greta_core.bench.report import (
        check_same_stack,
        load_runs,
        merge_runs,
        write_csv,
        write_json,
    )
    from greta_core.errors import BenchError

    device = grid_device(args.tiny)
    table = TINY_REGIMES if args.tiny else REGIMES
    meta = grid_metadata("hf_host_ab", device)
    earlier = []
    if args.append and (args.out / INTERLEAVED).is_file():
        earlier = load_runs(args.out / INTERLEAVED, [])
        try:  # refused before anything runs: a different GPU or stack does not compare
            check_same_stack([earlier[0]["metadata"], meta])
        except BenchError as exc:
            parser.error(f"--append: {exc}")
    rows = []
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    for name in families:
        model = build(FAMILIES[name], "vanilla", device, dtype, args.tiny)  # one per family
        for regime in regimes:
            row = run_regime(name, model, table[regime], device, args.rounds, args.steps,
                             args.warmup)  # fmt: skip
            rows.append(row)
            print(f"{name:8s} {regime:13s} vanilla {row['vanilla_ms']:8.2f} ms  "
                  f"greta {row['greta_ms']:8.2f} ms  speed {row['greta_vs_vanilla']:.2f}x "
                  f"(rounds {row['ratio_min']:.2f}-{row['ratio_max']:.2f})", flush=True)  # fmt: skip
        del model
    args.out.mkdir(parents=True, exist_ok=True)
    command = command_line("bench/hf_host_ab.py", sys.argv[1:] if argv is None else argv,
                           args.out / "x")  # fmt: skip
    doc = {"metadata": meta, "command": command, "rows": rows}
    if earlier:
        rows, doc["metadata"] = merge_runs([*earlier, doc], host_cell)
        doc["rows"] = rows
    write_json(args.out / INTERLEAVED, doc)
    write_csv(args.out / "hf_host_ab.csv", rows, FIELDS)
    if resummarize(args.out):  # a grid in the same folder: its verdicts now read these cells
        print(f"hf_grid summary in {args.out} updated with these cells")
    return 0


if __name__ == "__main__":
    sys.exit(main())
