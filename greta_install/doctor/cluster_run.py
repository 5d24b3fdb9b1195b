"""`greta doctor --cluster`: every rank of a torchrun/srun job collects its node's record,
the records are gathered through torch.distributed, and every rank judges them the same way.
Rank 0 prints the report (and writes it with --out); every rank exits with its verdict."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

from greta_install.doctor.cluster import cluster_findings, nodes
from greta_install.doctor.cluster_facts import collect_record, rendezvous_env
from greta_install.doctor.collective import isolated, run_child, worker_env
from greta_install.doctor.model import CheckResult, exit_code

WORKER = isolated("cluster_worker.py")


def gather(
    record: dict[str, Any], rdv: dict[str, str], timeout_s: float, backend: str = "gloo"
) -> list[dict[str, Any]] | str:
    """All ranks' records through the worker child, or why not."""
    with tempfile.TemporaryDirectory(prefix="greta-cluster-") as tmp:
        rec_path, out_path = Path(tmp, "record.json"), Path(tmp, "records.json")
        rec_path.write_text(json.dumps(record))
        env = {
            **os.environ,
            **worker_env(),
            **rdv,
            "GRETA_CLUSTER_RECORD": str(rec_path),
            "GRETA_CLUSTER_OUT": str(out_path),
            "GRETA_CLUSTER_TIMEOUT": str(timeout_s),
            "GRETA_CLUSTER_BACKEND": backend,
        }
        work = Path(tmp, "cwd")
        work.mkdir()
        code, tail = run_child(WORKER, env, timeout_s + 15.0, str(work))
        if code is None:
            return (
                f"no gather within {timeout_s:g} s: some rank never joined the rendezvous at "
                f"{rdv['MASTER_ADDR']}:{rdv['MASTER_PORT']} (is it reachable from every node? "
                "did every node start?)"
            )
        if code != 0:
            last = tail.strip().splitlines()[-1] if tail.strip() else ""
            where = f"{rdv['MASTER_ADDR']}:{rdv['MASTER_PORT']}"
            return f"the gather (rendezvous at {where}) failed with exit code {code}: {last}"
        try:
            return list(json.loads(out_path.read_text()))
        except (OSError, ValueError) as exc:
            return f"the gather worker wrote no records: {exc}"


def human_report(records: list[dict[str, Any]], results: list[CheckResult], verbose: bool) -> str:
    from greta_install.doctor.render import human

    header = f"greta doctor --cluster: {len(records)} rank(s) on {len(nodes(records))} node(s)"
    return human(results, header, verbose=verbose)


def write_result(out: Path, records: list[dict[str, Any]], results: list[CheckResult]) -> Path:
    now = datetime.datetime.now(datetime.timezone.utc)
    out.mkdir(parents=True, exist_ok=True)
    host = str(records[0].get("host", "unknown")).replace("/", "_")
    path = out / f"cluster_{host}_x{len(records)}_{now.strftime('%Y%m%dT%H%M%SZ')}.json"
    meta = {
        "date": now.isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "command": "greta doctor --cluster",
    }
    data = {"metadata": meta, "findings": [r.to_json() for r in results], "records": records}
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    return path


def run_command(args: argparse.Namespace) -> int:
    if args.snapshot:
        print("greta doctor: --cluster runs on the job's nodes, not on a snapshot", file=sys.stderr)
        return 2
    if not args.collective_timeout > 0:
        print("greta doctor: --collective-timeout must be positive", file=sys.stderr)
        return 2
    rdv = rendezvous_env(os.environ)
    if isinstance(rdv, str):
        print(f"greta doctor --cluster: {rdv}", file=sys.stderr)
        return 2
    rank = int(rdv["RANK"])
    record = collect_record({**os.environ, **rdv})
    gathered = gather(record, rdv, args.collective_timeout)
    if isinstance(gathered, str):
        print(f"greta doctor --cluster: rank {rank}: {gathered}", file=sys.stderr)
        return 1
    results = cluster_findings(gathered)
    code = exit_code(results)
    if rank != 0:
        return code  # rank 0 speaks for the job; every rank exits with the verdict
    if args.json:
        data = {"findings": [r.to_json() for r in results], "records": gathered}
        print(json.dumps(data, indent=2, default=str))
    else:
        print(human_report(gathered, results, args.verbose))
    if args.out:
        print(f"wrote {write_result(args.out, gathered, results)}", file=sys.stderr)
    return code
