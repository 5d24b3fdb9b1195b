"""Wall time of the commands a new user runs first: `import torch`, `import greta_core.torch`,
`greta smoke`, `greta doctor`, each a fresh process of this environment's Python, and whether
the installed frameworks had bytecode (greta_install.environment.bytecode) when it ran.

    python bench/startup_time.py --repeats 1 --out bench/results/startup/cpu.json

The numbers depend on the machine's load: compare runs made one after the other.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from greta_core.bench.metadata import header  # noqa: E402
from greta_install.environment import bytecode  # noqa: E402

COMMANDS: dict[str, list[str]] = {
    "import torch": ["-c", "import torch"],
    "import greta_core.torch": ["-c", "import greta_core.torch"],
    "greta smoke": ["-m", "greta", "smoke"],
    "greta doctor": ["-m", "greta", "doctor"],
}


def _time(args: list[str]) -> tuple[float, int]:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, *args], capture_output=True, timeout=1800, check=False, cwd=ROOT
    )
    return time.perf_counter() - start, proc.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--only", default="", help="comma list of command names to time")
    parser.add_argument("--out", type=Path, required=True, help="JSON result file")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(COMMANDS)
    states = {n: bytecode.package_state(n) for n in bytecode.FRAMEWORKS}
    rows = []
    for name in names:
        times, codes = [], []
        for _ in range(args.repeats):
            seconds, code = _time(COMMANDS[name])
            times.append(seconds)
            codes.append(code)
        rows.append(
            {
                "command": name,
                "median_s": round(statistics.median(times), 2),
                "runs_s": [round(t, 2) for t in times],
                "exit_codes": codes,
            }
        )
        print(f"{name:28s} {statistics.median(times):7.1f} s  exit {codes}", flush=True)
    result = {
        **header("startup", "cpu", "bench/startup_time.py", None, args.out),
        "bytecode": {n: f"{s.compiled}/{s.modules}" for n, s in states.items() if s is not None},
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
