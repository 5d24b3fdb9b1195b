"""`greta doctor --collective`: plan the run, start it, print the verdict and the suspects."""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path
from typing import Any

from greta_install.doctor.collective import SUSPECTS, CollectiveRun, probe, run_collective

CPU_DEFAULT_NPROC = 2


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

    from greta_install.doctor.checks import CHECKS
    from greta_install.doctor.collect import DOCTOR_ENV, collect_detection
    from greta_install.doctor.facts import Facts
    from greta_install.doctor.multi_gpu_facts import collect_multi_gpu
    from greta_install.doctor.runner import run_check
    from greta_install.system_view import LiveSystem

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


def run_command(args: argparse.Namespace) -> int:
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
