"""`greta tune`: time candidate launch configs of an op on this GPU; write the config table."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HELP = "Time candidate launch configs of an op on this GPU and write its config table."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--op", required=True, help="op to tune, e.g. matmul, vec_add, rms_norm")
    parser.add_argument("--arch", default="current", help="'current' (the visible GPU) only")
    parser.add_argument(
        "--out",
        type=Path,
        help="table to write (default: tuned-<arch>.json); pass "
        "greta_core/configs/tables/<arch>.json to update the shipped table",
    )
    parser.add_argument("--results", type=Path, help="also write all timings (JSON) here")
    parser.add_argument("--limit", type=int, help="time only the first N candidates (smoke runs)")


def run(args: argparse.Namespace) -> int:
    from greta_core.bench.tune import SPACES

    space = SPACES.get(args.op)
    if space is None:
        print(
            f"greta tune: no search space for op {args.op!r}; known: {', '.join(SPACES)}",
            file=sys.stderr,
        )
        return 2
    if args.arch != "current":
        print(
            "greta tune: timings are only meaningful on the GPU being tuned: use --arch current",
            file=sys.stderr,
        )
        return 2
    try:
        from greta_core.arch import device_arch

        arch = device_arch()
    except Exception as exc:
        print(f"greta tune: needs a GPU ({exc})", file=sys.stderr)
        return 2

    from greta_core.bench.tune import dump_table, merge_table, time_candidates
    from greta_core.configs import shipped_table

    out = args.out or Path(f"tuned-{arch}.json")
    base_text = out.read_text() if out.is_file() else shipped_table(arch)
    table = json.loads(base_text)
    table.setdefault("arch", arch)
    started = time.strftime("%Y-%m-%d", time.gmtime())
    tuned = time_candidates(space, arch, limit=args.limit)
    comment = f"Tuned with `greta tune --op {args.op}` on {arch} ({_gpu_name()}), {started}."
    table = merge_table(table, args.op, tuned.entry, comment)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(dump_table(table))
    print(f"wrote {out}: {args.op} -> {json.dumps(tuned.entry)}")
    if args.results:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(
            json.dumps(
                {
                    "op": args.op,
                    "arch": arch,
                    "gpu": _gpu_name(),
                    "date": started,
                    "timings_ms": tuned.timings,
                    "configs": tuned.configs,
                    "entry": tuned.entry,
                },
                indent=1,
                sort_keys=True,
            )
            + "\n"
        )
    return 0


def _gpu_name() -> str:
    try:
        import torch

        return str(torch.cuda.get_device_name(0))
    except Exception:
        return "unknown GPU"
