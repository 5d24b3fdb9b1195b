"""`greta doctor --collective`: run a real all-reduce and all-gather across the GPUs.

One process per GPU (NCCL on CUDA, RCCL on ROCm, both `nccl` to torch.distributed), or N
processes on the CPU with gloo. The ranks meet on a free 127.0.0.1 port. Each rank runs in
its own session, so a hang is ended by killing whole process groups: nothing is left
behind, whatever the ranks started. A hang or a wrong sum is answered with the
multi_gpu.* checks that explain most of them. torch is imported only in the workers.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from greta_install.commandline import NEUTRAL_CWD, greta_child

WORKER = tuple(greta_child("greta_install.doctor.collective_worker"))
# NVLink SHARP / multicast stays off in everything we start (the shared machines require it).
NO_MULTICAST = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
# The checks that explain a hung or wrong collective, in the order to read them.
SUSPECTS = (
    "multi_gpu.visible_devices",
    "multi_gpu.acs",
    "multi_gpu.iommu",
    "multi_gpu.p2p",
    "multi_gpu.fine_grain",
    "multi_gpu.links",
    "multi_gpu.numa_balancing",
)
KILL_GRACE_S = 3.0


@dataclass
class CollectiveRun:
    """What happened: the plan, each rank's result, and the verdict."""

    backend: str
    nproc: int
    nbytes: int
    iters: int
    timeout_s: float
    status: str = "ok"  # ok | hang | wrong | crashed
    message: str = ""
    ranks: list[dict[str, Any]] = field(default_factory=list)
    stderr_tail: dict[int, str] = field(default_factory=dict)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["stderr_tail"] = {str(k): v for k, v in self.stderr_tail.items()}
        return out


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def probe(timeout_s: float, worker: Sequence[str] = WORKER) -> dict[str, Any]:
    """What torch on this machine offers (GPU count, NCCL/gloo), from a subprocess."""
    try:
        done = subprocess.run(
            [*worker, "--probe"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **NO_MULTICAST},
            check=False,
            cwd=NEUTRAL_CWD,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"torch probe failed: {exc}"}
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-2:])
        return {"error": f"torch probe exited with {done.returncode}: {tail}"}
    try:
        return dict(json.loads(done.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        return {"error": f"torch probe printed no JSON: {done.stdout[-200:]!r}"}


def _status(proc: subprocess.Popen[bytes]) -> int | None:
    """The rank's exit status (negative: killed by that signal), None while it runs.

    It does not reap the rank: a zombie keeps its process-group id from being reused, so
    the group can still be killed safely afterwards.
    """
    if proc.returncode is not None:
        return proc.returncode
    info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    if info is None:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """End a rank and everything it started (its own session), then reap it."""
    if _status(proc) is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + KILL_GRACE_S
        while _status(proc) is None and time.monotonic() < deadline:
            time.sleep(0.05)
    # The leader is alive or a zombie here, so its pid still names this group only.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    # A rank stuck in the driver (uninterruptible) dies when the driver lets go.
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10 * KILL_GRACE_S)


def _tail(path: Path, lines: int = 6) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


def run_collective(
    nproc: int,
    backend: str,
    nbytes: int,
    iters: int,
    timeout_s: float,
    worker: Sequence[str] = WORKER,
    capture: bool = False,
) -> CollectiveRun:
    """Start ``nproc`` ranks, wait at most ``timeout_s``, and judge what they report."""
    run = CollectiveRun(backend, nproc, nbytes, iters, timeout_s)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="greta-collective-") as tmp:
        work = Path(tmp)
        port = free_port()
        procs: list[subprocess.Popen[bytes]] = []
        hung: list[int] = []
        try:
            for rank in range(nproc):
                env = {
                    **os.environ,
                    **NO_MULTICAST,
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port),
                    "RANK": str(rank),
                    "LOCAL_RANK": str(rank),
                    "WORLD_SIZE": str(nproc),
                    "GRETA_COLLECTIVE_BACKEND": backend,
                    "GRETA_COLLECTIVE_BYTES": str(nbytes),
                    "GRETA_COLLECTIVE_ITERS": str(iters),
                    "GRETA_COLLECTIVE_TIMEOUT": str(timeout_s),
                    "GRETA_COLLECTIVE_RESULT": str(work / f"rank{rank}.json"),
                    "GRETA_COLLECTIVE_CAPTURE": "1" if capture else "0",
                    # gloo must not wander onto another interface than loopback.
                    "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
                }
                with open(work / f"rank{rank}.err", "wb") as err:
                    procs.append(
                        subprocess.Popen(
                            list(worker),
                            env=env,
                            cwd=tmp,
                            stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL,
                            stderr=err,
                            start_new_session=True,
                        )
                    )
            deadline = start + timeout_s
            while time.monotonic() < deadline:
                codes = [_status(p) for p in procs]
                if all(c is not None for c in codes):
                    break
                if any(c not in (None, 0) for c in codes):
                    # One rank died: the others would wait in the collective until the
                    # timeout. Give them a moment to report, then stop.
                    time.sleep(min(KILL_GRACE_S, max(0.0, deadline - time.monotonic())))
                    break
                time.sleep(0.05)
            hung = [r for r, p in enumerate(procs) if _status(p) is None]
        finally:
            for proc in procs:
                kill_group(proc)
        run.seconds = time.monotonic() - start
        for rank, proc in enumerate(procs):
            result_file = work / f"rank{rank}.json"
            try:
                result = json.loads(result_file.read_text())
            except (OSError, ValueError):
                result = {"rank": rank, "error": f"no result (exit code {proc.returncode})"}
            run.ranks.append(result)
            tail = _tail(work / f"rank{rank}.err")
            if tail:
                run.stderr_tail[rank] = tail
    _judge(run, hung)
    return run


def _judge(run: CollectiveRun, hung: list[int]) -> None:
    # A hung rank has no error of its own to tell: the first rank that reported one does.
    errors = [
        (r.get("rank"), r["error"])
        for r in run.ranks
        if r.get("error") and r.get("rank") not in hung
    ]
    measured = all(r.get("all_reduce_ok") and r.get("all_gather_ok") for r in run.ranks)
    if hung and measured:
        run.status = "hang"
        run.message = (
            "both collectives were correct, then an all-reduce inside a graph capture hung "
            "(capture the computation only; call collectives outside the graph)"
        )
    elif hung and len(hung) == run.nproc:
        run.status = "hang"
        run.message = (
            f"no rank finished within {run.timeout_s:g} s: the collective hung "
            "(all ranks were stopped)"
        )
    elif hung:
        run.status = "hang"
        run.message = f"rank(s) {hung} were still waiting after the others stopped" + (
            f"; rank {errors[0][0]}: {errors[0][1]}" if errors else ""
        )
    elif errors:
        run.status = "crashed"
        run.message = f"rank {errors[0][0]} failed: {errors[0][1]}"
    elif not measured:
        run.status = "wrong"
        bad = next(r for r in run.ranks if not (r.get("all_reduce_ok") and r.get("all_gather_ok")))
        what = "all-reduce" if not bad.get("all_reduce_ok") else "all-gather"
        detail = bad.get("all_reduce_error", "")
        run.message = f"rank {bad.get('rank')}: the {what} result is wrong {detail}".strip()
    else:
        run.stderr_tail = {}  # warnings of a run that worked are noise in its record
        r0 = run.ranks[0]
        run.message = (
            f"all-reduce and all-gather correct on {run.nproc} ranks; "
            f"busbw all-reduce {r0['all_reduce_busbw']:.2f} GB/s, "
            f"all-gather {r0['all_gather_busbw']:.2f} GB/s at {r0['bytes'] / 2**20:g} MiB"
        )
        if "graph_capture" in r0:
            run.message += f"; all-reduce in a graph capture: {r0['graph_capture']}"
