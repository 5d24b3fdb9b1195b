"""`greta doctor`: check this machine (or a snapshot) for the known ways GPU stacks break."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from greta_install.model import TARGETS

HELP = (
    "Check this machine's Python, GPU access, torch, triton and jax, and say how to fix problems."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--snapshot",
        metavar="DIR",
        help="check a `greta snapshot` directory instead of this machine",
    )
    parser.add_argument(
        "--target", choices=TARGETS, help="judge against this target, not the detected one"
    )
    parser.add_argument(
        "--check-index",
        action="store_true",
        help="also ask the package indexes whether every locked version exists (needs the network)",
    )
    parser.add_argument(
        "--probe-timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="time limit for each framework probe subprocess (default: 120)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="also list skipped checks")
    coll = parser.add_argument_group("collective test (--collective)")
    coll.add_argument(
        "--collective",
        action="store_true",
        help="run an all-reduce and an all-gather across the GPUs (torch.distributed; "
        "NCCL/RCCL, or gloo on the CPU) and report the bus bandwidth",
    )
    coll.add_argument(
        "--nproc", type=int, metavar="N", help="ranks (default: one per visible GPU; 2 on CPU)"
    )
    coll.add_argument("--cpu", action="store_true", help="use gloo on the CPU even with GPUs")
    coll.add_argument(
        "--size-mb", type=float, default=64.0, metavar="MB", help="message size (default: 64)"
    )
    coll.add_argument("--iters", type=int, default=20, help="timed iterations (default: 20)")
    coll.add_argument(
        "--collective-timeout",
        type=float,
        default=180.0,
        metavar="SECONDS",
        help="stop every rank after this long and call it a hang (default: 180)",
    )
    coll.add_argument(
        "--capture",
        action="store_true",
        help="also capture an all-reduce in a CUDA/HIP graph (RCCL refuses it since ROCm 7.0)",
    )
    coll.add_argument("--out", type=Path, metavar="DIR", help="also write the result JSON here")
    coll.add_argument(
        "--sizes-mb",
        metavar="LIST",
        help="in a torchrun/srun job: message sizes in MiB, comma-separated "
        "(default: 1,16,64,256 on GPUs, 0.25,1 with gloo)",
    )
    coll.add_argument(
        "--busbw-min",
        type=float,
        metavar="GB/S",
        help="in a torchrun/srun job: all-reduce bus bandwidth to reach at sizes of 64 MiB and "
        "more (default from the link: NVLink 100, XGMI 50, PCIe 5, RDMA a quarter of the "
        "ports' line rate, sockets 1, gloo none)",
    )
    coll.add_argument(
        "--stall-timeout",
        type=float,
        metavar="SECONDS",
        help="in a torchrun/srun job: a collective stuck this long is a hang; the watchdog "
        "names the rank and node that stalled it (default: a third of --collective-timeout)",
    )
    coll.add_argument(
        "--cluster",
        action="store_true",
        help="run under torchrun/srun on every node: gather each node's versions, NICs, RDMA "
        "GID tables, /dev/shm and NCCL/RCCL settings through torch.distributed and compare them",
    )


def _internal_error(exc: BaseException) -> Any:
    from greta_install.doctor.model import CheckResult

    return CheckResult(
        "doctor.internal",
        "the doctor itself",
        "fail",
        f"internal error in greta doctor: {type(exc).__name__}: {exc}",
        "greta snapshot greta-snapshot   # and attach it with this output to a GRETA bug report",
        {"traceback": traceback.format_exc()[-4000:]},
    )


def _diagnose(args: argparse.Namespace) -> tuple[list[Any], dict[str, Any]]:
    from greta_install.detection.system_view import open_view
    from greta_install.doctor.collect import collect_facts
    from greta_install.doctor.runner import run_checks

    view = open_view(args.snapshot)
    if not args.snapshot:
        # The probes import torch and jax in subprocesses: seconds of silence otherwise.
        print(
            f"greta doctor: probing torch and jax in subprocesses (up to {args.probe_timeout:.0f} s)...",
            file=sys.stderr,
            flush=True,
        )
    facts = collect_facts(
        view,
        target=args.target,
        check_index=args.check_index,
        probe_timeout_s=args.probe_timeout,
        snapshot=args.snapshot,
    )
    context = {
        "mode": "live" if facts.live else "snapshot",
        "snapshot": args.snapshot,
        "target": facts.target,
        "target_source": facts.target_source,
    }
    return run_checks(facts), context


def run(args: argparse.Namespace) -> int:
    if args.cluster:
        from greta_install.doctor.cluster_run import run_command as run_cluster

        return run_cluster(args)
    if args.collective:
        from greta_install.doctor.collective_run import run_command

        return run_command(args)
    from greta_install.doctor.model import exit_code
    from greta_install.doctor.render import as_json, human

    if not args.probe_timeout > 0:  # also rejects nan
        print("greta doctor: --probe-timeout must be a positive number of seconds", file=sys.stderr)
        return 2
    try:
        results, context = _diagnose(args)
    except FileNotFoundError as exc:
        # A snapshot path that does not exist is the user's typo, not a machine problem.
        print(f"greta doctor: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        results = [_internal_error(exc)]
        context = {"mode": "snapshot" if args.snapshot else "live", "snapshot": args.snapshot}
    if args.json:
        text = json.dumps(as_json(results, context), indent=2, default=str)
    else:
        where = f"snapshot {args.snapshot}" if args.snapshot else "this machine"
        target = context.get("target")
        source = " (from --target)" if context.get("target_source") == "option" else ""
        header = f"greta doctor: {where}, target {target or 'unknown'}{source}"
        text = human(results, header, verbose=args.verbose)
    _write(text)
    return exit_code(results)


def _write(text: str) -> None:
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # `greta doctor | head`: the reader left; not an error of the doctor.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
