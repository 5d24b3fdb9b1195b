"""`greta doctor --cluster` inside a program whose process group already exists.

    import torch.distributed as dist
    from greta_core.distributed import cluster_preflight

    dist.init_process_group("nccl")  # as the training script does
    for finding in cluster_preflight():
        if finding.status in ("warn", "fail") and dist.get_rank() == 0:
            print(finding.id, finding.finding, finding.fix)

Every rank collects its node's record (greta_install.doctor.cluster_facts), the records are
``all_gather_object``-ed over ``group`` and every rank gets the same findings back.
"""

from __future__ import annotations

import os
from typing import Any

from greta_install.doctor.cluster import cluster_findings
from greta_install.doctor.cluster_facts import collect_record
from greta_install.doctor.cluster_worker import gather_records
from greta_install.doctor.model import CheckResult


def cluster_preflight(group: Any = None) -> list[CheckResult]:
    """The cluster findings of every rank in ``group`` (default: the whole job). A
    collective call: every rank of the group must make it."""
    import torch.distributed as dist

    record = collect_record(dict(os.environ))
    record["rank"] = dist.get_rank()
    return cluster_findings(gather_records(record, group))
