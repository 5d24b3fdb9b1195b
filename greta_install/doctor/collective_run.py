"""`greta doctor --collective`: plan the run, start it, print the verdict and the suspects."""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path
from typing import Any

from greta_install.doctor.collective import (
    SUSPECTS,
    CollectiveRun,
    JobRun,
    probe,
    run_collective,
    run_job_rank,
)

CPU_DEFAULT_NPROC = 2


def in_job(environ: dict[str, str]) -> bool:
    """Started as one rank of a torchrun or srun job (then the job's ranks are the ranks)."""
    if "RANK" in environ and "WORLD_SIZE" in environ:
        return True
    return "SLURM_PROCID" in environ and environ.get("SLURM_NTASKS", "1") not in ("", "1")


def parse_sizes(text: str | None) -> list[float] | str:
    if not text:
        return []
    try:
        sizes = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        return f"--sizes-mb {text!r}: a comma-separated list of MiB"
    if not sizes or any(not s > 0 for s in sizes):
        return "--sizes-mb: every size must be positive"
    return sorted(sizes)


def plan(args: argparse.Namespace, offer: dict[str, Any]) -> tuple[str, int] | str:
    """(backend, nproc) for this machine, or why there is nothing to run."""
    if offer.get("error"):
        return str(offer["error"])
    gpus = int(offer.get("gpus") or 0)
    if gpus and not args.cpu:
        if not offer.get("nccl"):
            return "torch sees GPUs but was built without NCCL/RCCL (torch.distributed 'nccl')"
        nproc = args.nproc or gpus
        if nproc > gpus:
            return f"--nproc {nproc} asks for more ranks than the {gpus} visible GPU(s)"
        if nproc < 2:
            return "one GPU visible: there is no collective to check (use --cpu --nproc 2 for gloo)"
        return "nccl", nproc
    if not offer.get("gloo"):
        return "torch was built without gloo: no CPU collective available"
    nproc = args.nproc or CPU_DEFAULT_NPROC
    if nproc < 2:
        return "--nproc must be at least 2"
    return "gloo", nproc


def suspects() -> list[Any]:
    """The multi_gpu.* checks on this machine that are not ok (cheap: no torch probe)."""
    import os

    from greta_install.detection.system_view import LiveSystem
    from greta_install.doctor.checks import CHECKS
    from greta_install.doctor.collect import DOCTOR_ENV, collect_detection
    from greta_install.doctor.facts import Facts
    from greta_install.doctor.multi_gpu_facts import collect_multi_gpu
    from greta_install.doctor.runner import run_check

    view = LiveSystem()
    facts = Facts(live=True)
    facts.detection, facts.detection_error = collect_detection(view)
    facts.target = getattr(facts.detection, "target", None)
    facts.lspci = view.run("lspci")
    facts.kfd_sysfs = view.exists("/sys/class/kfd")
    facts.env = {k: os.environ[k] for k in DOCTOR_ENV if k in os.environ}
    facts.multi_gpu = collect_multi_gpu(view, gpus_seen=2)
    by_id = {c.id: c for c in CHECKS}
    results = [run_check(by_id[i], facts) for i in SUSPECTS if i in by_id]
    return [r for r in results if r.status in ("warn", "fail")]


def human(run: CollectiveRun, offer: dict[str, Any], found: list[Any]) -> str:
    label = {"ok": "ok", "hang": "FAIL", "wrong": "FAIL", "crashed": "FAIL"}[run.status]
    device = run.ranks[0].get("device", "?") if run.ranks else "?"
    lines = [
        f"greta doctor --collective: {run.nproc} ranks, backend {run.backend} "
        f"({'RCCL' if offer.get('hip') and run.backend == 'nccl' else run.backend.upper()}), "
        f"{device}, torch {offer.get('torch')}",
        "",
        f"  {label:<4}  collective  {run.message}",
    ]
    if run.status == "ok":
        r0 = run.ranks[0]
        for op in ("all_reduce", "all_gather"):
            lines.append(
                f"        {op:<10}  {1e6 * r0[op + '_s']:10.1f} us  algbw {r0[op + '_algbw']:8.2f} "
                f"GB/s  busbw {r0[op + '_busbw']:8.2f} GB/s"
            )
    else:
        for rank, tail in sorted(run.stderr_tail.items()):
            lines.append(f"        rank {rank} stderr: {tail.splitlines()[-1][:200]}")
        if found:
            lines += ["", "  checks that explain most hangs and wrong sums on this machine:"]
            for r in found:
                lines.append(f"  {r.status.upper():<4}  {r.id}  {r.finding}")
                if r.fix:
                    lines += [f"        fix: {line}" for line in r.fix.splitlines()]
        else:
            lines.append(
                "  the multi_gpu.* checks found nothing; rerun with NCCL_DEBUG=INFO and see "
                "`greta doctor -v`"
            )
    return "\n".join(lines)


def write_result(out: Path, run: CollectiveRun, offer: dict[str, Any]) -> Path:
    now = datetime.datetime.now(datetime.timezone.utc)
    device = (run.ranks[0].get("device") if run.ranks else None) or "unknown"
    tag = device.replace(" ", "_").replace("/", "_")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"collective_{tag}_x{run.nproc}_{now.strftime('%Y%m%dT%H%M%SZ')}.json"
    meta = {"date": now.isoformat(timespec="seconds"), "platform": platform.platform(), **offer}
    path.write_text(json.dumps({"metadata": meta, "result": run.to_json()}, indent=2) + "\n")
    return path


def job_table(run: JobRun) -> str:
    """The per-size table and the verdict, as rank 0 prints it."""
    label = "ok" if run.status == "ok" else "FAIL"
    peers = run.result.get("peers") or []
    hosts = sorted({str(p.get("host")) for p in peers})
    gate = "none" if run.threshold_gbps is None else f"{run.threshold_gbps:g} GB/s"
    lines = [
        f"greta doctor --collective: {run.world} ranks of a job on {len(hosts) or '?'} host(s) "
        f"({', '.join(hosts)}), backend {run.backend}, "
        f"{run.result.get('device', '?')}, link {run.link}, gate {gate}",
        "",
        f"  {'size':>10}  {'all_reduce us':>14}  {'busbw GB/s':>10}  {'all_gather us':>14}  "
        f"{'busbw GB/s':>10}  gate",
    ]
    for r in run.rows:
        lines.append(
            f"  {r['bytes'] / 2**20:>6g} MiB  {1e6 * r['all_reduce_s']:>14.1f}  "
            f"{r['all_reduce_busbw']:>10.2f}  {1e6 * r['all_gather_s']:>14.1f}  "
            f"{r['all_gather_busbw']:>10.2f}  {r['gate']}"
        )
    lines += ["", f"  {label:<4}  collective  {run.message}"]
    if run.status != "ok" and run.stderr_tail:
        lines.append(f"        stderr: {run.stderr_tail.strip().splitlines()[-1][:200]}")
    return "\n".join(lines)


def write_job_result(out: Path, run: JobRun, offer: dict[str, Any]) -> list[Path]:
    """JSON (everything) and CSV (one row per size), with the machine and versions."""
    import csv

    now = datetime.datetime.now(datetime.timezone.utc)
    device = str(run.result.get("device") or "unknown").replace(" ", "_").replace("/", "_")
    stem = f"collective_job_{device}_x{run.world}_{now.strftime('%Y%m%dT%H%M%SZ')}"
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "date": now.isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "command": "greta doctor --collective (torchrun/srun job)",
        **offer,
    }
    json_path = out / f"{stem}.json"
    json_path.write_text(json.dumps({"metadata": meta, "result": run.to_json()}, indent=2) + "\n")
    csv_path = out / f"{stem}.csv"
    with open(csv_path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(
            [
                "date",
                "device",
                "torch",
                "backend",
                "world",
                "link",
                "bytes",
                "all_reduce_s",
                "all_reduce_busbw_gbps",
                "all_gather_s",
                "all_gather_busbw_gbps",
                "threshold_gbps",
                "gate",
            ]
        )
        for r in run.rows:
            w.writerow(
                [
                    meta["date"],
                    run.result.get("device"),
                    offer.get("torch"),
                    run.backend,
                    run.world,
                    run.link,
                    r["bytes"],
                    r["all_reduce_s"],
                    r["all_reduce_busbw"],
                    r["all_gather_s"],
                    r["all_gather_busbw"],
                    run.threshold_gbps,
                    r["gate"],
                ]
            )
    return [json_path, csv_path]


def run_job(args: argparse.Namespace) -> int:
    """This process is one rank of a torchrun/srun job: join it and measure across nodes."""
    import os

    from greta_install.doctor.cluster_facts import rendezvous_env

    rdv = rendezvous_env(os.environ)
    if isinstance(rdv, str):
        print(f"greta doctor --collective: {rdv}", file=sys.stderr)
        return 2
    sizes = parse_sizes(args.sizes_mb)
    if isinstance(sizes, str):
        print(f"greta doctor: {sizes}", file=sys.stderr)
        return 2
    if args.busbw_min is not None and not args.busbw_min >= 0:
        print("greta doctor: --busbw-min must be a bandwidth in GB/s, 0 or more", file=sys.stderr)
        return 2
    if args.stall_timeout is not None and not args.stall_timeout > 0:
        print("greta doctor: --stall-timeout must be positive", file=sys.stderr)
        return 2
    stall = args.stall_timeout or max(5.0, args.collective_timeout / 3)
    run = run_job_rank(
        rdv,
        "gloo" if args.cpu else "auto",
        [int(m * 2**20) for m in sizes] or None,
        args.iters,
        args.collective_timeout,
        stall,
        args.busbw_min,
        capture=args.capture,
    )
    offer = {k: run.result.get(k) for k in ("torch", "cuda", "hip")}
    code = 0 if run.status == "ok" else 1
    if run.rank != 0:
        if run.status != "ok":
            print(f"greta doctor --collective: rank {run.rank}: {run.message}", file=sys.stderr)
        return code
    if args.json:
        print(json.dumps({**run.to_json(), "probe": offer}, indent=2, default=str))
    else:
        print(job_table(run))
    if args.out:
        for path in write_job_result(args.out, run, offer):
            print(f"wrote {path}", file=sys.stderr)
    return code


def run_command(args: argparse.Namespace) -> int:
    import os

    if not args.snapshot and in_job(dict(os.environ)):
        if not (args.collective_timeout > 0 and args.iters > 0):
            print(
                "greta doctor: --collective-timeout and --iters must be positive", file=sys.stderr
            )
            return 2
        return run_job(args)
    if args.snapshot:
        print("greta doctor: --collective runs on this machine, not on a snapshot", file=sys.stderr)
        return 2
    if not (args.collective_timeout > 0 and args.size_mb > 0 and args.iters > 0):
        print(
            "greta doctor: --collective-timeout, --size-mb and --iters must be positive",
            file=sys.stderr,
        )
        return 2
    offer = probe(min(args.collective_timeout, 120.0))
    planned = plan(args, offer)
    if isinstance(planned, str):
        print(f"greta doctor --collective: {planned}", file=sys.stderr)
        return 2
    backend, nproc = planned
    nbytes = int(args.size_mb * 2**20)
    run = run_collective(
        nproc, backend, nbytes, args.iters, args.collective_timeout, capture=args.capture
    )
    found = suspects() if run.status != "ok" and backend == "nccl" else []
    if args.json:
        data = {**run.to_json(), "probe": offer, "suspects": [r.to_json() for r in found]}
        print(json.dumps(data, indent=2, default=str))
    else:
        print(human(run, offer, found))
    if args.out:
        print(f"wrote {write_result(args.out, run, offer)}", file=sys.stderr)
    return 0 if run.status == "ok" else 1
