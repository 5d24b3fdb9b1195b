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
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from greta_install.commandline import NEUTRAL_CWD


def isolated(script: str) -> tuple[str, ...]:
    """Run a child script of this package as ``python -I -c <its text>``: isolated from
    PYTHONPATH and user site, and (started in an empty directory) from a stray ``torch/``
    folder; it needs no GRETA on its path, only torch."""
    source = (Path(__file__).with_name(script)).read_text(encoding="utf-8")
    return (sys.executable, "-I", "-c", source)


WORKER = isolated("collective_worker.py")
# NVLink SHARP / multicast stays off in everything we start (the shared machines require it).
NO_MULTICAST = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
TORCH_PATH_ENV = "GRETA_WORKER_TORCH_PATH"


def worker_env() -> dict[str, str]:
    """What every worker gets beyond os.environ: multicast off, and the directory where this
    interpreter finds torch. ``python -I`` drops PYTHONPATH and the user's site-packages;
    a worker appends this directory to its path, so it still finds the torch we would
    (a torch it finds on its own comes first)."""
    import importlib.util

    env = dict(NO_MULTICAST)
    with contextlib.suppress(ImportError, ValueError):
        spec = importlib.util.find_spec("torch")  # locates, never imports
        if spec is not None and spec.origin:
            env[TORCH_PATH_ENV] = str(Path(spec.origin).parent.parent)
    return env


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
            env={**os.environ, **worker_env()},
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


def run_child(
    argv: Sequence[str], env: dict[str, str], timeout_s: float, cwd: str
) -> tuple[int | None, str]:
    """Run one child in its own session for at most ``timeout_s``: (exit code or None when
    it was stopped for running too long, the tail of its stderr). Nothing is left running."""
    err_path = Path(cwd) / "child.err"
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(
            list(argv),
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout_s
    # torchrun and `timeout` stop a rank with SIGTERM: unwind, so the child's group is ended
    # here too instead of outliving us in its own session.
    main = threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGTERM, _exit_on_signal) if main else None
    try:
        while _status(proc) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        code = _status(proc)
    finally:
        kill_group(proc)
        if main:
            signal.signal(signal.SIGTERM, old)
    return code, _tail(err_path, 8)


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


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
        extra = worker_env()
        try:
            for rank in range(nproc):
                env = {
                    **os.environ,
                    **extra,
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


# --- one rank of a torchrun/srun job (`greta doctor --collective` across nodes) ------------

# Bus bandwidth (GB/s) a healthy link of each kind clears at bandwidth-bound sizes: well under
# its peak, so a pass is no benchmark and a fail is a broken or misrouted link. NVLink: the
# 100 GB/s gate of NVIDIA's NVSentinel multi-node preflight; RDMA: a quarter of the ACTIVE
# ports' line rate (8 x 400 Gb/s gives the same 100 GB/s); gloo on CPUs: no gate.
LINK_BUSBW_GBPS: dict[str, float | None] = {
    "nvlink": 100.0,
    "xgmi": 50.0,
    "pcie": 5.0,
    "socket": 1.0,
    "gloo": None,
}
RDMA_FRACTION = 0.25
GATED_BYTES = 64 * 2**20  # smaller messages are latency-bound: reported, not gated


def rdma_gbits(ports: list[dict[str, Any]]) -> float:
    """Sum of the ACTIVE RDMA ports' line rates in Gb/s ('400 Gb/sec (4X NDR)')."""
    total = 0.0
    for port in ports:
        rate = str(port.get("rate") or "").split()
        if port.get("state") == "ACTIVE" and rate:
            with contextlib.suppress(ValueError):
                total += float(rate[0])
    return total


def local_link(topology_text: dict[str, str | None]) -> str | None:
    """The fastest GPU-to-GPU link kind on this host: nvlink, xgmi or pcie (None: unknown)."""
    from greta_install.detection.parsers.topology import parse_amd_topology, parse_nvidia_topo

    topo = parse_nvidia_topo(topology_text.get("nvidia")) or parse_amd_topology(
        topology_text.get("amd"), topology_text.get("rocm")
    )
    if topo is None:
        return None
    for kind in ("nvlink", "xgmi"):
        if topo.pairs_of(kind):
            return kind
    return "pcie"


def link_facts() -> dict[str, Any]:
    """What this node offers its collectives, for the default bandwidth gate."""
    from greta_install.detection.system_view import LiveSystem
    from greta_install.doctor.cluster_facts import collect_rdma

    view = LiveSystem()
    text = {
        "nvidia": view.run("nvidia-smi-topo"),
        "amd": view.run("amd-smi-topology"),
        "rocm": None,
    }
    if text["nvidia"] is None and text["amd"] is None:
        text["rocm"] = view.run("rocm-smi-topo")
    return {"local": local_link(text), "rdma_gbits": rdma_gbits(collect_rdma(view))}


def default_gate(backend: str, peers: list[dict[str, Any]]) -> tuple[str, float | None]:
    """(link kind, busbw threshold in GB/s) for the job's ranks (``peers``: host + link)."""
    if backend != "nccl":
        return "gloo", LINK_BUSBW_GBPS["gloo"]
    if len({p.get("host") for p in peers}) > 1:
        rates = [float((p.get("link") or {}).get("rdma_gbits") or 0) for p in peers]
        if rates and min(rates) > 0:
            return "rdma", RDMA_FRACTION * min(rates) / 8
        return "socket", LINK_BUSBW_GBPS["socket"]
    kind = (peers[0].get("link") or {}).get("local") if peers else None
    kind = kind or "pcie"
    return kind, LINK_BUSBW_GBPS.get(kind)


def gate_rows(rows: list[dict[str, Any]], threshold: float | None) -> list[dict[str, Any]]:
    """Each size with its verdict: 'pass'/'below' at bandwidth-bound sizes, else 'n/a'."""
    gated_from = min(GATED_BYTES, max((r["bytes"] for r in rows), default=0))
    out = []
    for row in rows:
        verdict = "n/a"
        if threshold is not None and row["bytes"] >= gated_from:
            verdict = "pass" if row["all_reduce_busbw"] >= threshold else "below"
        out.append({**row, "gate": verdict})
    return out


@dataclass
class JobRun:
    """One rank's view of a collective run across a torchrun/srun job."""

    rank: int
    world: int
    backend: str
    status: str = "ok"  # ok | hang | wrong | crashed | slow
    message: str = ""
    link: str = ""
    threshold_gbps: float | None = None
    result: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    stderr_tail: str = ""

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def judge_job(run: JobRun, code: int | None, timeout_s: float, threshold: float | None) -> JobRun:
    """The verdict of one rank's worker (pure but for its arguments)."""
    res = run.result
    peers = res.get("peers") or []
    run.link, default = default_gate(run.backend, peers)
    run.threshold_gbps = threshold if threshold is not None else default
    run.rows = gate_rows(res.get("sizes") or [], run.threshold_gbps)
    if res.get("stalled"):
        run.status, run.message = "hang", str(res["error"])
    elif code is None:
        run.status = "hang"
        run.message = (
            f"the rank was stopped after {timeout_s:g} s before its watchdog could tell "
            f"(last step: {res.get('phase') or 'joining the process group'})"
        )
    elif res.get("error"):
        run.status, run.message = "crashed", f"rank {run.rank}: {res['error']}"
    elif code != 0:
        run.status, run.message = "crashed", f"rank {run.rank}'s worker exited with {code}"
    elif not (res.get("all_reduce_ok") and res.get("all_gather_ok")):
        bad = next(r for r in run.rows if not (r["all_reduce_ok"] and r["all_gather_ok"]))
        what = "all-reduce" if not bad["all_reduce_ok"] else "all-gather"
        run.status = "wrong"
        run.message = f"the {what} of {bad['bytes'] / 2**20:g} MiB gave a wrong result"
    elif any(r["gate"] == "below" for r in run.rows):
        slow = [r for r in run.rows if r["gate"] == "below"]
        run.status = "slow"
        run.message = (
            f"all-reduce bus bandwidth {slow[0]['all_reduce_busbw']:.2f} GB/s at "
            f"{slow[0]['bytes'] / 2**20:g} MiB is below the {run.threshold_gbps:g} GB/s "
            f"expected of a {run.link} link (set another with --busbw-min)"
        )
    else:
        last = run.rows[-1] if run.rows else {}
        hosts = len({p.get("host") for p in peers}) or 1
        run.message = (
            f"all-reduce and all-gather correct on {run.world} ranks ({hosts} host(s), "
            f"{run.link}); busbw {last.get('all_reduce_busbw', 0):.2f} GB/s at "
            f"{last.get('bytes', 0) / 2**20:g} MiB"
        )
        if "graph_capture" in res:
            run.message += f"; all-reduce in a graph capture: {res['graph_capture']}"
    return run


def run_job_rank(
    rdv: dict[str, str],
    backend: str,  # "auto": NCCL/RCCL where torch sees a GPU, else gloo
    sizes: list[int] | None,
    iters: int,
    timeout_s: float,
    stall_s: float,
    threshold: float | None,
    capture: bool = False,
    worker: Sequence[str] = WORKER,
) -> JobRun:
    """Run this rank's worker in the job's group (env:// from torchrun/srun) and judge it."""
    rank, world = int(rdv["RANK"]), int(rdv["WORLD_SIZE"])
    run = JobRun(rank, world, backend)
    with tempfile.TemporaryDirectory(prefix="greta-collective-") as tmp:
        result_path = Path(tmp, "result.json")
        env = {
            **os.environ,
            **worker_env(),
            **rdv,
            "GRETA_COLLECTIVE_MODE": "job",
            "GRETA_COLLECTIVE_BACKEND": backend,
            "GRETA_COLLECTIVE_SIZES": ",".join(map(str, sizes or ())),
            "GRETA_COLLECTIVE_ITERS": str(iters),
            "GRETA_COLLECTIVE_TIMEOUT": str(timeout_s),
            "GRETA_COLLECTIVE_STALL_S": str(stall_s),
            "GRETA_COLLECTIVE_RESULT": str(result_path),
            "GRETA_COLLECTIVE_CAPTURE": "1" if capture else "0",
            "GRETA_COLLECTIVE_LINK": json.dumps(link_facts()),
        }
        work = Path(tmp, "cwd")
        work.mkdir()
        code, run.stderr_tail = run_child(worker, env, timeout_s, str(work))
        try:
            run.result = json.loads(result_path.read_text())
        except (OSError, ValueError):
            run.result = {} if code is None else {"error": f"no result (exit code {code})"}
    run.backend = str(run.result.get("backend") or backend)
    return judge_job(run, code, timeout_s, threshold)
