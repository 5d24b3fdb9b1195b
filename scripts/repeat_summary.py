"""Summarise the CSVs of scripts/repeat_tests.sh into one CSV and a JSON with metadata.

Usage: .venv/bin/python scripts/repeat_summary.py OUT_STEM CSV... -- COMMAND TEXT
writes OUT_STEM.csv (rows of every CSV, by run) and OUT_STEM.json (counts per worker layout
and test order, failures, the command, the commit, the stack and the CPU).
"""

from __future__ import annotations

import csv
import importlib.metadata as md
import json
import platform
import subprocess
import sys
from collections import Counter
from pathlib import Path


def _cpu() -> dict[str, object]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    model = next(
        (ln.split(":", 1)[1].strip() for ln in text.splitlines() if "model name" in ln), ""
    )
    flags = next(
        (ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []
    )
    return {
        "model": model,
        "avx512f": "avx512f" in flags,
        "logical_cpus": text.count("processor\t:"),
    }


def main(argv: list[str]) -> int:
    if "--" not in argv or len(argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    split = argv.index("--")
    stem, files, command = Path(argv[1]), argv[2:split], " ".join(argv[split + 1 :])
    rows = []
    for name in files:
        with open(name, newline="") as fh:
            rows += list(csv.DictReader(fh))
    rows.sort(key=lambda r: int(r["run"]))
    with open(stem.with_suffix(".csv"), "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    versions = {}
    for dist in ("torch", "triton", "pytest", "pytest-xdist", "pytest-random-order"):
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            versions[dist] = None
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    summary = {
        "command": command,
        "runs": len(rows),
        "failed_runs": [int(r["run"]) for r in rows if r["exit_code"] != "0"],
        "seeds": sorted({int(r["seed"]) for r in rows}),
        "by_workers": dict(sorted(Counter(f"-n {r['workers']}" for r in rows).items())),
        "by_order": dict(
            sorted(Counter(r["order"].split(":")[0] for r in rows).items())
        ),  # "file" or "random" (seeded per run)
        "seconds_per_run": {
            "min": min(int(r["seconds"]) for r in rows),
            "max": max(int(r["seconds"]) for r in rows),
        },
        "summarised_at_commit": commit,
        "python": platform.python_version(),
        "versions": versions,
        "cpu": _cpu(),
    }
    stem.with_suffix(".json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0 if not summary["failed_runs"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
