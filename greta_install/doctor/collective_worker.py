"""One rank of `greta doctor --collective`; started by collective.py, never imported by it.

Reads its rank and the run's parameters from the environment (MASTER_ADDR/PORT, RANK,
WORLD_SIZE, LOCAL_RANK as torch.distributed's env:// wants, GRETA_COLLECTIVE_* for the
rest), runs an all-reduce and an all-gather, checks the results, times both, and writes
one JSON object to GRETA_COLLECTIVE_RESULT. ``--probe`` prints what this machine offers.
torch is imported inside the functions: the installer half must import without it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from typing import Any


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


def _capture(dist: Any, buf: Any) -> str:
    """Whether an all-reduce can be captured in a CUDA/HIP graph and replayed.

    NCCL allows it; RCCL refuses collectives during graph capture since ROCm 7.0.
    """
    import torch

    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            dist.all_reduce(buf)
        graph.replay()
        torch.cuda.synchronize()
        return "ok"
    except Exception as exc:
        return f"refused: {type(exc).__name__}: {str(exc)[:300]}"


def _write(path: str, result: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(result, fh)


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
    if backend == "nccl":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        name = torch.cuda.get_device_name(local)

        def sync() -> None:
            torch.cuda.synchronize(device)

    else:
        device, name = torch.device("cpu"), "cpu"

        def sync() -> None:
            return None

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


def main(argv: list[str]) -> int:
    if argv[1:2] == ["--probe"]:
        print(json.dumps(probe()))
        return 0
    result_path = os.environ["GRETA_COLLECTIVE_RESULT"]
    try:
        result = run_rank(result_path)
    except Exception as exc:  # reported by the launcher, with the rank that failed
        rank = int(os.environ.get("RANK", -1))
        _write(result_path, {"rank": rank, "error": f"{type(exc).__name__}: {exc}"})
        return 1
    _write(result_path, result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
