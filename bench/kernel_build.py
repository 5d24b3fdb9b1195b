"""Kernel-wheel build time for one arch, per worker count: ``greta build-kernels --jobs N``.

Each run is a fresh ``python -m greta build-kernels`` process with a fresh Triton cache
(the build compiles into its own staging directories; nothing is reused between runs).
Reported per run: wall seconds, CPU seconds of the build and its workers (user + sys),
peak RSS of the largest process, kernels compiled, seconds to the first output line and
to the first progress line (``[###...] k/N``), the wheel's sha256 (equal across job
counts: the bytes do not depend on ``--jobs``; SOURCE_DATE_EPOCH is fixed for that), and
the load average before and after (other work on the machine slows a build down).

    python bench/kernel_build.py --arch gfx942 --jobs 1,2 --out bench/results/kernel_build/gfx942
    python bench/kernel_build.py --arch sm_90 --jobs 16 --out "$OUT/kernel_build_sm90"

Writes ``<out>.json`` (metadata + runs) and ``<out>.csv`` (one row per run).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from greta_core.bench.metadata import command_line, git_commit  # noqa: E402
from greta_install.commandline import parse_progress  # noqa: E402

FIELDS = ("arch", "jobs", "ok", "kernels", "wall_s", "cpu_s", "compile_cpu_s", "peak_rss_mib",
          "first_line_s", "first_progress_s", "last_progress_s", "loadavg_before",
          "loadavg_after", "wheel_bytes", "wheel_sha256")  # fmt: skip


def per_module(outcomes: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per kernel module: kernels, and the workers' wall and CPU seconds inside the compiles
    (what the dry run's per-kernel estimate is taken from)."""
    out: dict[str, dict[str, float]] = {}
    for outcome in outcomes:
        for row in outcome.get("results", []):
            m = out.setdefault(
                row["module"], {"kernels": 0, "compile_s": 0.0, "compile_cpu_s": 0.0}
            )
            m["kernels"] += 1
            m["compile_s"] += row.get("seconds", 0.0)
            m["compile_cpu_s"] += row.get("cpu_seconds", 0.0)
    for m in out.values():
        m["compile_s"] = round(m["compile_s"], 2)
        m["compile_cpu_s"] = round(m["compile_cpu_s"], 2)
        m["cpu_s_per_kernel"] = round(m["compile_cpu_s"] / max(m["kernels"], 1), 3)
    return dict(sorted(out.items()))


def one_run(arch: str, jobs: int, kernels: str, variants: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="greta-kbench-") as work:
        out = Path(work) / "wheels"
        report = Path(work) / "report.json"
        argv = [sys.executable, "-m", "greta", "build-kernels", "--arch", arch, "--out", str(out)]
        argv += ["--jobs", str(jobs), "--report", str(report), "--variants", variants]
        if kernels:
            argv += ["--kernels", kernels]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "TRITON_INTERPRET": "0",
            "TRITON_CACHE_DIR": str(Path(work) / "triton-cache"),
            "SOURCE_DATE_EPOCH": "1700000000",
            "PYTHONUNBUFFERED": "1",
        }
        load_all_before = os.getloadavg()
        load_before = load_all_before[0]
        usage_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        first_line = first_progress = last_progress = None
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        assert proc.stdout is not None
        log = []
        for line in proc.stdout:
            now = time.perf_counter() - start
            first_line = now if first_line is None else first_line
            if parse_progress(line) is not None:
                first_progress = now if first_progress is None else first_progress
                last_progress = now
            log.append(line)
        proc.wait()
        wall = time.perf_counter() - start
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        wheels = sorted(out.glob("*.whl"))
        outcomes = json.loads(report.read_text()) if report.is_file() else []
        modules = per_module(outcomes)
        sys.stdout.write(log[-1] if log else "")
        return {
            "arch": arch,
            "jobs": jobs,
            "ok": proc.returncode == 0 and len(wheels) == 1,
            "returncode": proc.returncode,
            "kernels": sum(o.get("compiled", 0) for o in outcomes),
            "wall_s": round(wall, 2),
            "cpu_s": round(
                usage.ru_utime - usage_before.ru_utime + usage.ru_stime - usage_before.ru_stime, 2
            ),
            # ru_maxrss of children: the largest single process so far (KiB on Linux).
            "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
            "first_line_s": round(first_line, 2) if first_line is not None else None,
            "first_progress_s": round(first_progress, 2) if first_progress is not None else None,
            # After the last kernel: putting the wheel together (serial, in the parent).
            "last_progress_s": round(last_progress, 2) if last_progress is not None else None,
            "compile_cpu_s": round(sum(m["compile_cpu_s"] for m in modules.values()), 2),
            "per_module": modules,
            "loadavg_before": round(load_before, 2),
            "loadavg_1_5_15_before": [round(v, 2) for v in load_all_before],
            "loadavg_after": round(os.getloadavg()[0], 2),
            "wheel_sha256": hashlib.sha256(wheels[0].read_bytes()).hexdigest() if wheels else "",
            "wheel_bytes": wheels[0].stat().st_size if wheels else 0,
            # The last lines, the run's temporary directory left out of them.
            "tail": [line.rstrip().replace(work, "<tmp>") for line in log[-4:]],
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="gfx942")
    parser.add_argument("--jobs", default="1,2", help="comma list of worker counts")
    parser.add_argument("--kernels", default="", help="subset of kernel modules (default all)")
    parser.add_argument("--variants", default="aligned,ragged")
    parser.add_argument("--out", type=Path, required=True, help="path stem of the .json/.csv")
    args = parser.parse_args()
    import triton

    commit = git_commit()["commit"]  # the code the runs build, read before they start
    runs = []
    for jobs in [int(j) for j in args.jobs.split(",") if j.strip()]:
        print(f"--- {args.arch} --jobs {jobs}", flush=True)
        runs.append(one_run(args.arch, jobs, args.kernels, args.variants))
        print(json.dumps({k: runs[-1][k] for k in FIELDS}), flush=True)
    result = {
        "bench": "kernel_build",
        "command": command_line("bench/kernel_build.py", sys.argv[1:], args.out),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": commit,
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "triton": triton.__version__,
        "kernels_subset": args.kernels or "all",
        "variants": args.variants,
        "same_wheel_for_all_jobs": len({r["wheel_sha256"] for r in runs}) == 1,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    with args.out.with_suffix(".csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(runs)
    print(f"wrote {args.out.with_suffix('.json')} and .csv")
    return 0 if all(r["ok"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
