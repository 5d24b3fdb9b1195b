"""`greta backends`: which vendor library serves each operation on this machine."""

from __future__ import annotations

import argparse
import json

HELP = "Show the NVIDIA -> AMD library mapping, what is present, and what each op will use."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable report")


def run(args: argparse.Namespace) -> int:
    from greta_core import backends

    report = backends.probe()
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print(backends.format_text(report))
    # Forced-but-unavailable implementations are the one hard failure here.
    return 1 if any(row.get("error") for row in report.get("operations", [])) else 0
