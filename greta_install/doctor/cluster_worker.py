"""The torch.distributed half of `greta doctor --cluster`; a child script, never imported by
the installer (it imports torch). Started as ``python -I -c <this file's text>`` in an empty
directory, so neither PYTHONPATH nor a stray ``torch/`` folder can change what it imports.

It reads this rank's record (GRETA_CLUSTER_RECORD, written by cluster_facts.py), adds the
torch half (torch, CUDA/HIP and NCCL versions, the GPUs' archs), joins the job's group
(env:// as torchrun or srun set it up; gloo, so a broken GPU stack still reports) and
``all_gather_object``s the records; every rank writes the whole list to GRETA_CLUSTER_OUT.
`gather_records` is the same step inside a program whose process group already exists.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from typing import Any


def torch_facts() -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "nccl": None,
        "gpus": [],
    }
    if torch.cuda.is_available():
        try:
            nccl = torch.cuda.nccl.version()
            out["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
        except Exception:
            out["nccl"] = None
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            if out["hip"]:  # "gfx90a:sramecc+:xnack-" -> "gfx90a"
                arch = str(getattr(props, "gcnArchName", "") or "gfx?").split(":")[0]
            else:
                arch = f"sm_{props.major}{props.minor}"
            out["gpus"].append({"name": props.name, "arch": arch, "bus_id": _bus_id(props)})
    return out


def _bus_id(props: Any) -> str | None:
    bus = getattr(props, "pci_bus_id", None)
    if bus is None:
        return None
    return f"{getattr(props, 'pci_domain_id', 0):04x}:{bus:02x}:{getattr(props, 'pci_device_id', 0):02x}"


def gather_records(record: dict[str, Any], group: Any = None) -> list[dict[str, Any]]:
    """Every rank's record, in rank order, over an existing process group."""
    import torch.distributed as dist

    record = {**record, "torch": record.get("torch") or torch_facts()}
    if group is None:
        record["rank"] = dist.get_rank()
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, record, group=group)
    return [dict(r) for r in gathered]


def _find_torch() -> None:
    """Append the launcher's torch directory (GRETA_WORKER_TORCH_PATH): ``python -I`` left
    out PYTHONPATH and the user's site-packages, where that torch may live."""
    extra = os.environ.get("GRETA_WORKER_TORCH_PATH")
    if extra and extra not in sys.path:
        sys.path.append(extra)


def main() -> int:
    _find_torch()
    import torch.distributed as dist

    with open(os.environ["GRETA_CLUSTER_RECORD"], encoding="utf-8") as fh:
        record = json.load(fh)
    out = os.environ["GRETA_CLUSTER_OUT"]
    timeout = float(os.environ.get("GRETA_CLUSTER_TIMEOUT", "60"))
    try:
        record["torch"] = torch_facts()
    except Exception as exc:  # a broken GPU stack is a finding, not the end of the gather
        record["torch"] = {"error": f"{type(exc).__name__}: {exc}"}
    dist.init_process_group(
        os.environ.get("GRETA_CLUSTER_BACKEND", "gloo"), timeout=timedelta(seconds=timeout)
    )
    try:
        records = gather_records(record)
        dist.barrier()  # nobody tears down while a peer still reads
    finally:
        dist.destroy_process_group()
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(records, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
