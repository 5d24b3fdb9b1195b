"""`greta bench`: time GRETA ops against the vendor path and torch.compile."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "Time GRETA ops side by side with the vendor libraries and torch.compile."

_PRESETS = ("smoke", "standard", "perf")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--preset",
        choices=_PRESETS,
        default="smoke",
        help="smoke: tiny shapes, seconds, runs on CPU too; standard: a few sizes; "
        "perf: the large sizes (GPU only)",
    )
    parser.add_argument(
        "--ops",
        nargs="+",
        default=[],
        metavar="OP",
        help="only these ops (space or comma separated), e.g. --ops rms_norm matmul",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output folder (default: a new folder under the user cache, e.g. "
        "~/.cache/greta/bench/<date-time>)",
    )
    parser.add_argument(
        "--device", choices=("auto", "cuda", "cpu"), default="auto", help="where to run"
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="stop starting new cases after this many seconds (the rest are recorded as skipped)",
    )
    parser.add_argument(
        "--no-overhead", action="store_true", help="skip the binding-overhead measurements"
    )
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile column")
    parser.add_argument(
        "--timing",
        choices=("events", "graph"),
        default="events",
        help="events: do_bench around eager calls (host launch cost included when it "
        "dominates); graph: CUDA/HIP-graph replays, GPU time only",
    )


def parse_ops(values: list[str]) -> tuple[str, ...]:
    return tuple(op for value in values for op in value.split(",") if op)


def run(args: argparse.Namespace) -> int:
    from greta_core.bench.report import summary_table
    from greta_core.bench.runner import BenchError, BenchOptions
    from greta_core.bench.runner import run as run_bench

    options = BenchOptions(
        preset=args.preset,
        ops=parse_ops(args.ops),
        out=args.out,
        device=args.device,
        budget_s=args.budget_s,
        overhead=not args.no_overhead,
        compile=not args.no_compile,
        graph=args.timing == "graph",
    )
    try:
        result = run_bench(options)
    except BenchError as exc:
        print(f"greta bench: {exc}", file=sys.stderr)
        return 2
    doc = result.document
    print()
    print(summary_table(doc["results"], timings=doc["metadata"].get("timings") != "interpreter"))
    if doc["overhead"]:
        print()
        print(f"{'binding overhead (host time per call)':<44} {'status':<8} {'us/call':>9}  ran")
        for r in doc["overhead"]:
            us = f"{r['host_us_per_call']:9.1f}" if r["status"] == "ok" else " " * 9
            detail = r.get("implementation_ran") or r.get("reason") or ""
            print(f"{r['binding']:<44} {r['status']:<8} {us}  {detail[:60]}")
    print()
    for kind, path in result.files.items():
        print(f"{kind}: {path}")
    errors = [r for r in doc["results"] if r["status"] == "error"]
    # Errors are recorded per case and do not fail the command: a bench of a partial
    # build is still a result. The exit code says only whether the run itself worked.
    if errors:
        print(f"{len(errors)} implementation(s) failed; see 'reason' in {result.files['csv']}")
    return 0
