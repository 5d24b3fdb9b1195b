"""One rank of `greta doctor --collective`; started by collective.py, never imported by it.

Reads its rank and the run's parameters from the environment (MASTER_ADDR/PORT, RANK,
WORLD_SIZE, LOCAL_RANK as torch.distributed's env:// wants, GRETA_COLLECTIVE_* for the
rest), runs an all-reduce and an all-gather, checks the results, times both, and writes
one JSON object to GRETA_COLLECTIVE_RESULT. ``--probe`` prints what this machine offers.
torch is imported inside the functions: the installer half must import without it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
from datetime import timedelta
from typing import Any

HEARTBEAT_S = 0.5
# Between the two reads of the heartbeats: six beats, so a loaded host that delays one
# beat thread by a second is not taken for a frozen rank.
SAMPLE_GAP_S = 6 * HEARTBEAT_S
# How long a heartbeat thread keeps trying a store it cannot reach before it takes the job
# for ended (a peer's verdict reaches a rank only through its heartbeat).
STORE_GONE_S = 10.0
HB_PREFIX = "greta/collective/hb/"
ABORT_KEY = "greta/collective/verdict"
# Each rank that took the verdict says so here (after writing its report): the judging rank
# waits for them before it exits, since its exit can take the job's store down (the store
# lives beside rank 0) before a loaded peer's beat thread has read the verdict. A judging
# rank acks its own verdict: two ranks that judged at once then wait for each other.
ACK_PREFIX = "greta/collective/ack/"
# How long the judging rank waits for the other ranks' acks: a frozen or dead rank never
# sends one.
ACK_WAIT_S = 20 * HEARTBEAT_S


def probe() -> dict[str, Any]:
    import torch

    gpu = torch.cuda.is_available()
    return {
        "torch": torch.__version__,
        "hip": getattr(torch.version, "hip", None),
        "cuda": torch.version.cuda,
        "gpus": torch.cuda.device_count() if gpu else 0,
        "nccl": gpu and torch.distributed.is_nccl_available(),
        "gloo": torch.distributed.is_gloo_available(),
    }


def bus_bandwidth(op: str, nbytes: int, seconds: float, world: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s as nccl-tests defines them (PERFORMANCE.md).

    all_reduce: busbw = algbw * 2(n-1)/n; all_gather (nbytes = the gathered total):
    busbw = algbw * (n-1)/n. Both measure what each link carries, comparable to its peak.
    """
    algbw = nbytes / seconds / 1e9
    factor = 2 * (world - 1) / world if op == "all_reduce" else (world - 1) / world
    return algbw, algbw * factor


def _timed(fn: Any, iters: int, sync: Any) -> float:
    fn()  # warm-up: NCCL builds its rings/channels on the first call
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - start) / iters


def _capture(dist: Any, buf: Any, group: Any = None) -> str:
    """Whether an all-reduce can be captured in a CUDA/HIP graph and replayed.

    NCCL allows it; RCCL refuses collectives during graph capture since ROCm 7.0.
    """
    import torch

    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            dist.all_reduce(buf, group=group)
        graph.replay()
        torch.cuda.synchronize()
        return "ok"
    except Exception as exc:
        return f"refused: {type(exc).__name__}: {str(exc)[:300]}"


def device_and_sync(torch: Any, backend: str, local: int | None) -> tuple[Any, str, Any]:
    """(device, its name, a synchronise function) for a rank: the rank's GPU under NCCL
    (``local`` None: the current one), the CPU otherwise."""
    if backend != "nccl":
        return torch.device("cpu"), "cpu", lambda: None
    if local is not None:
        torch.cuda.set_device(local)
    device = torch.device("cuda", torch.cuda.current_device())
    return device, torch.cuda.get_device_name(device), lambda: torch.cuda.synchronize(device)


def _write(path: str, result: dict[str, Any]) -> None:
    """Whole or not at all: the watchdog thread and the main thread both write the result,
    and a reader must never find half a file."""
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    os.replace(tmp, path)


def run_rank(result_path: str) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    backend = os.environ["GRETA_COLLECTIVE_BACKEND"]
    nbytes = int(os.environ["GRETA_COLLECTIVE_BYTES"])
    iters = int(os.environ["GRETA_COLLECTIVE_ITERS"])
    timeout = float(os.environ["GRETA_COLLECTIVE_TIMEOUT"])
    # all_gather_single replaces all_gather_into_tensor (deprecated in torch 2.13).
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    device, name, sync = device_and_sync(torch, backend, local)

    dist.init_process_group(
        backend,
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout),
        **({"device_id": device} if backend == "nccl" else {}),
    )
    try:
        out: dict[str, Any] = {"rank": rank, "device": name, "backend": backend}
        # Correctness: rank r contributes r+1 everywhere; every element must sum to n(n+1)/2.
        n = max(1, nbytes // 4)
        x = torch.full((n,), float(rank + 1), device=device)
        dist.all_reduce(x)
        want = world * (world + 1) / 2
        out["all_reduce_ok"] = bool(torch.all(x == want).item())
        if not out["all_reduce_ok"]:
            bad = (x != want).nonzero()[0].item()
            out["all_reduce_error"] = f"element {bad} is {x[bad].item()}, expected {want}"
        # Small integers stay exact in float32 at any size: row r must be pattern + 1024 r.
        pattern = torch.arange(n, device=device, dtype=torch.float32) % 1024
        gathered = torch.empty(world * n, device=device)
        all_gather(gathered, pattern + 1024 * rank)
        offsets = 1024 * torch.arange(world, device=device, dtype=torch.float32)[:, None]
        out["all_gather_ok"] = bool(torch.equal(gathered.view(world, n), pattern + offsets))
        # Bandwidth on zero-filled buffers (values stay finite however many times summed).
        buf = torch.zeros(n, device=device)
        t_ar = _timed(lambda: dist.all_reduce(buf), iters, sync)
        t_ag = _timed(lambda: all_gather(gathered, buf), iters, sync)
        # The slowest rank sets the pace of a collective: report its time.
        times = torch.tensor([t_ar, t_ag], device=device, dtype=torch.float64)
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        t_ar, t_ag = times.tolist()
        out["bytes"] = n * 4
        out["all_reduce_s"], out["all_gather_s"] = t_ar, t_ag
        out["all_reduce_algbw"], out["all_reduce_busbw"] = bus_bandwidth(
            "all_reduce", n * 4, t_ar, world
        )
        out["all_gather_algbw"], out["all_gather_busbw"] = bus_bandwidth(
            "all_gather", world * n * 4, t_ag, world
        )
        dist.barrier()
        if backend == "nccl" and os.environ.get("GRETA_COLLECTIVE_CAPTURE") == "1":
            # Written first: a capture that wedges the communicator must not lose the rest.
            _write(result_path, out)
            out["graph_capture"] = _capture(dist, buf)
        return out
    finally:
        dist.destroy_process_group()


class Heartbeat:
    """This rank's liveness and position, published through the job's TCPStore.

    A daemon thread writes ``{beat, seq, phase, host, node}`` every HEARTBEAT_S; the main
    thread moves ``seq``/``phase`` before each collective. A watchdog thread notices when the
    main thread has sat in one collective longer than ``stall_s``, reads every rank's entry
    twice, and names the suspects: ranks whose beat stopped (frozen or dead), ranks behind
    the others (alive but never entered this collective), or, when every rank is inside it,
    the transport between the nodes. It writes that verdict and ends the rank: a collective
    cannot be interrupted from Python.
    """

    def __init__(
        self,
        store_addr: tuple[str, int],
        rank: int,
        world: int,
        stall_s: float,
        result_path: str | None,
        partial: dict[str, Any],
    ) -> None:
        self.addr, self.rank, self.world, self.stall_s = store_addr, rank, world, stall_s
        self.result_path, self.partial = result_path, partial
        self.seq, self.phase, self.busy_since = 0, "joined", 0.0
        self.busy = False
        # Set by the watchdog before it posts a verdict: from then on the watchdog alone ends
        # this rank, after the acks (see _beat).
        self.judging = False
        self.beat = 0
        self.me = {
            "host": socket.gethostname(),
            "node": os.environ.get("GROUP_RANK", "?"),
            "local_rank": os.environ.get("LOCAL_RANK", "0"),
            "transport": {
                k: os.environ[k]
                for k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA")
                if k in os.environ
            },
        }
        self._stop = threading.Event()

    def _report(self, result: dict[str, Any]) -> None:
        if self.result_path:
            _write(self.result_path, result)
        else:  # inside a user's program: the verdict goes to its stderr before the exit
            print(f"greta collective watchdog: {result.get('error')}", file=sys.stderr, flush=True)

    def _store(self) -> Any:
        import torch.distributed as dist

        return dist.TCPStore(
            self.addr[0], self.addr[1], is_master=False, timeout=timedelta(seconds=30)
        )

    def start(self) -> None:
        threading.Thread(target=self._beat, daemon=True).start()
        threading.Thread(target=self._watch, daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def enter(self, phase: str) -> None:
        self.seq += 1
        self.phase, self.busy_since, self.busy = phase, time.monotonic(), True

    def leave(self) -> None:
        self.busy = False
        self.phase = f"between collectives, after {self.phase}"

    def _beat(self) -> None:
        store, failed_since = None, None
        while not self._stop.is_set():
            self.beat += 1
            entry = {**self.me, "beat": self.beat, "seq": self.seq, "phase": self.phase}
            try:
                store = store or self._store()
                store.set(f"{HB_PREFIX}{self.rank}", json.dumps(entry))
                # A peer's watchdog judged a stall: every rank ends with its verdict, so no
                # rank waits out the launcher's timeout in a collective that cannot finish.
                # Not on the judging rank: its exit here, one beat after its own verdict,
                # would cut the watchdog's wait for the acks short and take the store down
                # before a loaded peer read the verdict (seen under load: the stalled rank
                # then waited out the launcher's timeout). `judging` is read after the check
                # since the watchdog sets it before it posts.
                if store.check([ABORT_KEY]) and not self.judging:
                    verdict = json.loads(store.get(ABORT_KEY))
                    self._report({**self.partial, **verdict, "rank": self.rank})
                    store.set(f"{ACK_PREFIX}{self.rank}", "1")
                    os._exit(3)
                failed_since = None
            except Exception:
                # One failed exchange (a loaded host, a dropped connection) must not silence
                # this rank for good: it would miss a peer's verdict and wait out the
                # launcher's timeout. A store unreachable for STORE_GONE_S: the job is ending.
                now = time.monotonic()
                failed_since = failed_since or now
                if now - failed_since > STORE_GONE_S:
                    # If the launcher has to stop this rank, its report then names the step
                    # the rank was in, where the verdict it missed would have.
                    if self.result_path:
                        _write(self.result_path, {**self.partial, "rank": self.rank,
                                                  "phase": self.phase})  # fmt: skip
                    return
                store = None  # a fresh connection next beat
            self._stop.wait(HEARTBEAT_S)

    def _read(self, store: Any) -> dict[int, dict[str, Any]]:
        out = {}
        for r in range(self.world):
            key = f"{HB_PREFIX}{r}"
            try:
                if store.check([key]):
                    out[r] = json.loads(store.get(key))
            except Exception:
                continue
        return out

    def _watch(self) -> None:
        store = None
        while not self._stop.wait(HEARTBEAT_S):
            if not (self.busy and time.monotonic() - self.busy_since > self.stall_s):
                continue
            try:
                store = store or self._store()
                first = self._read(store)
                time.sleep(SAMPLE_GAP_S)
                second = self._read(store)
            except Exception as exc:
                first, second = {}, {}
                self.partial["watchdog_error"] = f"{type(exc).__name__}: {exc}"
            verdict = judge_stall(self.world, first, second, self.phase, self.stall_s)
            verdict["judged_by"] = self.rank
            self._report({**self.partial, **verdict, "rank": self.rank})
            self.judging = True
            with contextlib.suppress(Exception):
                store = store or self._store()
                store.set(ABORT_KEY, json.dumps(verdict))
                store.set(f"{ACK_PREFIX}{self.rank}", "1")
                self._await_acks(store)
            os._exit(3)

    def _await_acks(self, store: Any) -> None:
        """Until every other rank has taken the verdict, or ACK_WAIT_S."""
        waiting = [f"{ACK_PREFIX}{r}" for r in range(self.world) if r != self.rank]
        deadline = time.monotonic() + ACK_WAIT_S
        while waiting and time.monotonic() < deadline:
            waiting = [key for key in waiting if not store.check([key])]
            if waiting:
                time.sleep(HEARTBEAT_S / 5)


def judge_stall(
    world: int,
    first: dict[int, dict[str, Any]],
    second: dict[int, dict[str, Any]],
    phase: str,
    stall_s: float,
) -> dict[str, Any]:
    """Who stalled a collective, from two reads of every rank's heartbeat (pure)."""

    def who(r: int) -> str:
        e = second.get(r) or first.get(r) or {}
        return f"rank {r} (node {e.get('node', '?')}, host {e.get('host', '?')})"

    silent = [r for r in range(world) if r not in second]
    frozen = [
        r
        for r in range(world)
        if r in first and r in second and second[r]["beat"] == first[r]["beat"]
    ]
    alive = {r: e for r, e in second.items() if r not in frozen}
    top = max((e["seq"] for e in alive.values()), default=0)
    behind = sorted(r for r, e in alive.items() if e["seq"] < top)
    suspects: list[dict[str, Any]] = []
    for r in silent:
        suspects.append(
            {
                "rank": r,
                "why": "never published a heartbeat (did not start or cannot reach the store)",
            }
        )
    for r in frozen:
        suspects.append(
            {
                "rank": r,
                "why": f"heartbeat stopped (process frozen or dead) at {second[r]['phase']}",
            }
        )
    for r in behind:
        suspects.append(
            {
                "rank": r,
                "why": f"alive but never entered the collective; it is at {alive[r]['phase']}",
            }
        )
    if suspects:
        names = "; ".join(f"{who(s['rank'])}: {s['why']}" for s in suspects)
        message = f"{phase} did not finish within {stall_s:g} s. Suspect {names}"
    else:
        links = sorted(
            {
                f"node {e.get('node')} ({e.get('host')}, {json.dumps(e.get('transport') or 'auto')})"
                for e in second.values()
            }
        )
        message = (
            f"{phase} did not finish within {stall_s:g} s with every rank inside it: the data "
            f"path between the nodes hangs; suspect link: {' <-> '.join(links)}"
        )
    return {
        "error": message,
        "stalled": True,
        "phase": phase,
        "suspects": suspects,
        "heartbeats": {str(r): e for r, e in second.items()},
    }


# Default message sizes of the job form (MiB): up to 256 MiB on GPUs, where bandwidth shows.
JOB_SIZES_MIB = {"nccl": (1.0, 16.0, 64.0, 256.0), "gloo": (0.25, 1.0)}


def _sizes(backend: str) -> list[int]:
    raw = os.environ.get("GRETA_COLLECTIVE_SIZES")
    if raw:
        return [int(x) for x in raw.split(",") if x]
    return [int(m * 2**20) for m in JOB_SIZES_MIB[backend]]


def _planted_stall(rank: int, index: int) -> None:
    """GRETA_COLLECTIVE_PLANT_STALL=RANK:SIZE_INDEX: that rank sleeps before that size, as a
    rank stuck in data loading would (tests of the watchdog; never set by GRETA)."""
    plant = os.environ.get("GRETA_COLLECTIVE_PLANT_STALL", "")
    if plant and plant == f"{rank}:{index}":
        time.sleep(3600)


def run_sweep(result_path: str) -> dict[str, Any]:
    """The multi-node form: this process is one rank of a torchrun/srun job (env://). Every
    size in GRETA_COLLECTIVE_SIZES is all-reduced and all-gathered (checked, then timed),
    the heartbeat watchdog watching each call."""
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", 0))
    backend = os.environ["GRETA_COLLECTIVE_BACKEND"]
    if backend == "auto":  # one torch import per rank: the launcher does not probe first
        gpu = torch.cuda.is_available() and dist.is_nccl_available()
        backend = "nccl" if gpu else "gloo"
    iters = int(os.environ["GRETA_COLLECTIVE_ITERS"])
    timeout = float(os.environ["GRETA_COLLECTIVE_TIMEOUT"])
    stall_s = float(os.environ.get("GRETA_COLLECTIVE_STALL_S", timeout / 2))
    if backend == "nccl":
        # srun --gpus-per-task leaves each task one visible GPU whatever its local rank.
        local %= max(1, torch.cuda.device_count())
    device, name, sync = device_and_sync(torch, backend, local)

    out: dict[str, Any] = {
        "rank": rank,
        "world": world,
        "device": name,
        "backend": backend,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
    }
    dist.init_process_group(
        backend,
        timeout=timedelta(seconds=timeout),
        **({"device_id": device} if backend == "nccl" else {}),
    )
    hb = Heartbeat(
        (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])),
        rank,
        world,
        stall_s,
        result_path,
        out,
    )
    hb.start()
    try:
        link = json.loads(os.environ.get("GRETA_COLLECTIVE_LINK", "{}"))
        capture = backend == "nccl" and os.environ.get("GRETA_COLLECTIVE_CAPTURE") == "1"
        return sweep(out, _sizes(backend), iters, device, sync, hb, link, capture, result_path)
    finally:
        hb.stop()
        dist.destroy_process_group()


class NoWatch:
    """A Heartbeat's interface with no watchdog (a group whose store is not reachable)."""

    def enter(self, phase: str) -> None:
        return None

    def leave(self) -> None:
        return None


def sweep(
    out: dict[str, Any],
    sizes: list[int],
    iters: int,
    device: Any,
    sync: Any,
    hb: Any,
    link: dict[str, Any],
    capture: bool,
    result_path: str | None = None,
    group: Any = None,
) -> dict[str, Any]:
    """Check and time an all-reduce and an all-gather of every size over ``group`` (the
    default group: the whole job), each call announced to ``hb``; fills and returns ``out``."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    peers: list[Any] = [None] * world
    hb.enter("the gather of the ranks' hosts")
    me = {
        "rank": rank,
        "host": socket.gethostname(),
        "node": os.environ.get("GROUP_RANK"),
        "link": link,
        "device": out.get("device"),
    }
    dist.all_gather_object(peers, me, group=group)
    hb.leave()
    out["peers"] = peers
    rows: list[dict[str, Any]] = []
    for index, nbytes in enumerate(sizes):
        _planted_stall(rank, index)
        n = max(1, nbytes // 4)
        label = f"{n * 4 / 2**20:g} MiB"
        x = torch.full((n,), float(rank + 1), device=device)
        hb.enter(f"all_reduce of {label} (check)")
        dist.all_reduce(x, group=group)
        sync()
        want = world * (world + 1) / 2
        ar_ok = bool(torch.all(x == want).item())
        pattern = torch.arange(n, device=device, dtype=torch.float32) % 1024
        gathered = torch.empty(world * n, device=device)
        hb.enter(f"all_gather of {label} (check)")
        all_gather(gathered, pattern + 1024 * rank, group=group)
        sync()
        offsets = 1024 * torch.arange(world, device=device, dtype=torch.float32)[:, None]
        ag_ok = bool(torch.equal(gathered.view(world, n), pattern + offsets))
        buf = torch.zeros(n, device=device)
        hb.enter(f"all_reduce of {label} (timed)")
        t_ar = _timed(lambda b=buf: dist.all_reduce(b, group=group), iters, sync)
        hb.enter(f"all_gather of {label} (timed)")
        t_ag = _timed(lambda g=gathered, b=buf: all_gather(g, b, group=group), iters, sync)
        times = torch.tensor([t_ar, t_ag], device=device, dtype=torch.float64)
        hb.enter(f"the max-reduce of the {label} timings")
        dist.all_reduce(times, op=dist.ReduceOp.MAX, group=group)
        hb.leave()
        t_ar, t_ag = times.tolist()
        row = {
            "bytes": n * 4,
            "all_reduce_ok": ar_ok,
            "all_gather_ok": ag_ok,
            "all_reduce_s": t_ar,
            "all_gather_s": t_ag,
        }
        row["all_reduce_algbw"], row["all_reduce_busbw"] = bus_bandwidth(
            "all_reduce", n * 4, t_ar, world
        )
        row["all_gather_algbw"], row["all_gather_busbw"] = bus_bandwidth(
            "all_gather", world * n * 4, t_ag, world
        )
        rows.append(row)
        out["sizes"] = rows
        if result_path:
            _write(result_path, out)  # what was measured survives a later hang
    out["all_reduce_ok"] = all(r["all_reduce_ok"] for r in rows)
    out["all_gather_ok"] = all(r["all_gather_ok"] for r in rows)
    if capture:
        if result_path:
            _write(result_path, out)
        hb.enter("an all-reduce inside a graph capture")
        out["graph_capture"] = _capture(dist, torch.zeros(1 << 20, device=device), group)
        hb.leave()
    hb.enter("the final barrier")
    dist.barrier(group=group)
    hb.leave()
    return out


def _find_torch() -> None:
    """Append the launcher's torch directory (GRETA_WORKER_TORCH_PATH): ``python -I`` left
    out PYTHONPATH and the user's site-packages, where that torch may live."""
    extra = os.environ.get("GRETA_WORKER_TORCH_PATH")
    if extra and extra not in sys.path:
        sys.path.append(extra)


def main(argv: list[str]) -> int:
    _find_torch()
    if argv[1:2] == ["--probe"]:
        print(json.dumps(probe()))
        return 0
    result_path = os.environ["GRETA_COLLECTIVE_RESULT"]
    sweep = os.environ.get("GRETA_COLLECTIVE_MODE") == "job"
    try:
        result = run_sweep(result_path) if sweep else run_rank(result_path)
    except Exception as exc:  # reported by the launcher, with the rank that failed
        rank = int(os.environ.get("RANK", -1))
        try:  # keep what was measured before the failure
            with open(result_path, encoding="utf-8") as fh:
                partial = json.load(fh)
        except (OSError, ValueError):
            partial = {}
        error = f"{type(exc).__name__}: {exc}"
        if partial.get("stalled"):
            # The watchdog's verdict came first: this error (a peer that ended on it closed
            # the connection) follows from the stall, and the verdict names its cause.
            _write(result_path, {**partial, "rank": rank, "then": error})
        else:
            _write(result_path, {**partial, "rank": rank, "error": error})
        return 1
    _write(result_path, result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
