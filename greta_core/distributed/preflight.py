"""`greta doctor --cluster` and `--collective` inside a program whose process group exists.

    import torch.distributed as dist
    from greta_core.distributed import cluster_preflight

    dist.init_process_group("nccl")  # as the training script does
    for finding in cluster_preflight():
        if finding.status in ("warn", "fail") and dist.get_rank() == 0:
            print(finding.id, finding.finding, finding.fix)

Every rank collects its node's record (greta_install.doctor.cluster_facts), the records are
``all_gather_object``-ed over ``group`` and every rank gets the same findings back.
`collective_check` runs the job form of `greta doctor --collective` over the group.
"""

from __future__ import annotations

import os
from typing import Any

from greta_install.doctor.cluster import cluster_findings
from greta_install.doctor.cluster_facts import collect_record
from greta_install.doctor.cluster_worker import gather_records
from greta_install.doctor.collective import JobRun, judge_job, link_facts
from greta_install.doctor.collective_worker import (
    JOB_SIZES_MIB,
    Heartbeat,
    NoWatch,
    device_and_sync,
    sweep,
)
from greta_install.doctor.model import CheckResult


def cluster_preflight(group: Any = None) -> list[CheckResult]:
    """The cluster findings of every rank in ``group`` (default: the whole job). A
    collective call: every rank of the group must make it."""
    import torch.distributed as dist

    record = collect_record(dict(os.environ))
    record["rank"] = dist.get_rank()
    return cluster_findings(gather_records(record, group))


def collective_check(
    group: Any = None,
    sizes_mib: tuple[float, ...] | None = None,
    iters: int = 10,
    busbw_min: float | None = None,
    stall_s: float = 60.0,
) -> JobRun:
    """All-reduce and all-gather of each size over ``group``, checked and timed, judged as
    `greta doctor --collective` judges a job (``.status``, ``.message``, ``.rows``). A
    collective call. On the whole job under torchrun (MASTER_ADDR/MASTER_PORT set), the
    heartbeat watchdog runs too: a collective stuck ``stall_s`` seconds ends the process
    with the suspects on stderr, as NCCL's own watchdog ends a hung job."""
    import torch
    import torch.distributed as dist

    backend = str(dist.get_backend(group))
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    device, name, sync = device_and_sync(torch, backend, None)

    out: dict[str, Any] = {
        "rank": rank,
        "world": world,
        "device": name,
        "backend": backend,
        "torch": torch.__version__,
    }
    sizes = [int(m * 2**20) for m in (sizes_mib or JOB_SIZES_MIB.get(backend, (1.0,)))]
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    hb: Any = NoWatch()
    if group is None and addr and port:
        hb = Heartbeat((addr, int(port)), rank, world, stall_s, None, out)
        hb.start()
    try:
        sweep(out, sizes, iters, device, sync, hb, link_facts(), False, group=group)
    finally:
        if isinstance(hb, Heartbeat):
            hb.stop()
    return judge_job(JobRun(rank, world, backend, result=out), 0, stall_s, busbw_min)
