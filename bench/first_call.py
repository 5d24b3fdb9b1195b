"""Time to the first result of each GRETA op: warmed kernel wheel vs wheel vs cold Triton JIT.

Every measurement is a fresh Python process with an empty Triton cache directory and its
own empty GRETA cache directory:

- ``cold``: the wheel is importable (same tuned configs) but ``GRETA_PRECOMPILED=0``
  turns its precompiled code off, so Triton compiles everything;
- ``wheel``: the kernel wheel's precompiled device code is served
  (``greta_core.kernel_wheels.precompiled``), but ``greta warm`` has not run: Triton still builds its
  host launcher modules with the C compiler and hashes its own build;
- ``warm``: as ``wheel``, after ``greta warm`` (what ``greta install`` runs) built the
  host launchers and remembered Triton's build key, in a process before the measured one.

Reported per op and mode (median of ``--repeats`` runs, modes interleaved):
``process_to_result_s`` (process spawn to the first result synchronised on the GPU),
``first_call_s`` (the first op call alone, inputs already on the GPU),
``second_call_s`` (the same call again: launch cost without compilation),
``host_builds`` / ``host_build_s`` (C compiler runs during the first call and their time)
and ``warm_s`` (the ``greta warm`` run, outside the measured process).

    python bench/first_call.py --wheel dist/greta_kernels_sm_90-0.1.0-py3-none-any.whl \\
        --ops vec_add,matmul,rms_norm --out bench/results/first_call_h100
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODES = ("cold", "wheel", "warm")
NUMBERS = ("process_to_result_s", "first_call_s", "second_call_s", "host_builds",
           "host_build_s", "warm_s")  # fmt: skip

CHILD = r"""
import json, sys, time
t_start = float(sys.argv[1])
op = sys.argv[2]
import torch
import triton.runtime.build as build
from greta_core.kernel_wheels import precompiled
builds = []
real_build = build._build
def timed_build(name, *args, **kwargs):
    t = time.time()
    try:
        return real_build(name, *args, **kwargs)
    finally:
        builds.append((name, time.time() - t))
build._build = timed_build
from greta_core.bench.tune import SPACES
problem = SPACES[op].problems[0]
call = problem.make(torch, "cuda")
torch.cuda.synchronize()
active = precompiled.activate()
t0 = time.time()
call()
torch.cuda.synchronize()
t1 = time.time()
call()
torch.cuda.synchronize()
t2 = time.time()
print(json.dumps({"process_to_result_s": t1 - t_start, "first_call_s": t1 - t0,
                  "second_call_s": t2 - t1, "precompiled_active": active,
                  "host_builds": len(builds), "host_build_s": sum(b[1] for b in builds),
                  "problem": problem.label}))
"""


def run_child(op: str, mode: str, wheel_dir: Path) -> dict:
    with (
        tempfile.TemporaryDirectory(prefix="greta-cold-cache-") as cache,
        tempfile.TemporaryDirectory(prefix="greta-cache-") as greta_cache,
    ):
        env = dict(os.environ)
        env["TRITON_INTERPRET"] = "0"  # not unset: greta-env.pth re-sets unset variables
        # Empty caches per run: the measured process finds nothing compiled before, and
        # nothing `greta warm` built unless this mode runs it.
        env["TRITON_CACHE_DIR"] = cache
        env["GRETA_CACHE_DIR"] = greta_cache
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(wheel_dir)])
        env["GRETA_PRECOMPILED"] = "0" if mode == "cold" else "1"
        warm_s = 0.0
        if mode == "warm":
            start = time.time()
            proc = subprocess.run(
                [sys.executable, "-m", "greta", "warm", "--json"],
                env=env, capture_output=True, text=True, timeout=900,
            )  # fmt: skip
            warm_s = time.time() - start
            if proc.returncode != 0:
                return {"error": "greta warm failed: " + (proc.stdout + proc.stderr)[-400:]}
        start = time.time()
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, repr(start), op],
            env=env, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed"}
    return json.loads(proc.stdout.strip().splitlines()[-1]) | {"warm_s": warm_s}


def metadata() -> dict:
    def out(cmd: list[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    info = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": platform.python_version(),
        "git_commit": out(["git", "-C", str(ROOT), "rev-parse", "HEAD"]),
        "gpu": out(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]),
    }
    try:
        import torch
        import triton

        info["torch"] = torch.__version__
        info["triton"] = triton.__version__
    except ImportError:
        pass
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path, required=True, help="the kernel wheel for this GPU")
    parser.add_argument("--ops", default="vec_add,matmul,rms_norm,layer_norm,softmax")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True, help="directory for CSV + JSON")
    args = parser.parse_args(argv)
    if not args.wheel.is_file():
        print(f"first_call: no wheel at {args.wheel}", file=sys.stderr)
        return 2
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    rows = []
    with tempfile.TemporaryDirectory(prefix="greta-wheel-") as unpacked:
        # Unpacking a py3-none-any wheel is what installing it does to site-packages.
        with zipfile.ZipFile(args.wheel) as zf:
            zf.extractall(unpacked)
        for op in ops:
            samples: dict[str, list[dict]] = {mode: [] for mode in MODES}
            for _ in range(args.repeats):
                for mode in MODES:
                    samples[mode].append(run_child(op, mode, Path(unpacked)))
            for mode, runs in samples.items():
                good = [r for r in runs if "error" not in r]
                row = {"op": op, "mode": mode, "runs": len(good)}
                if not good:
                    row["error"] = runs[0].get("error", "")
                else:
                    row["problem"] = good[0]["problem"]
                    row["precompiled_active"] = all(r["precompiled_active"] for r in good)
                    for key in NUMBERS:
                        row[key] = round(statistics.median(r[key] for r in good), 4)
                rows.append(row)
                print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    fields = ["op", "mode", "problem", "runs", "precompiled_active", *NUMBERS, "error"]
    with (args.out / "first_call.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: row.get(k, "") for k in fields})
    meta = metadata() | {"wheel": args.wheel.name, "repeats": args.repeats}
    (args.out / "first_call.json").write_text(
        json.dumps({"metadata": meta, "results": rows}, indent=1) + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
