"""How a callable is timed: triton's do_bench (device events, median) on a GPU,
``time.perf_counter`` on the CPU; plus host time per call for binding overhead."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TimingPolicy:
    """Warm-up and repetition budgets (milliseconds for do_bench, like its own arguments)."""

    warmup_ms: float = 25.0
    rep_ms: float = 100.0
    cpu_min_calls: int = 5
    cpu_max_calls: int = 200
    cpu_budget_s: float = 0.2
    overhead_calls: int = 2000
    overhead_budget_s: float = 1.0
    graph: bool = False  # time GPU work from CUDA-graph replays (no host launch cost)


@dataclass(frozen=True)
class Timing:
    median_ms: float
    method: str  # "do_bench", "cudagraph" or "perf_counter"
    calls: int  # timed calls (0 when do_bench chose the count)


def extra_peak_bytes(fn: Callable[[], Any]) -> int:
    """CUDA/ROCm memory one call of `fn` needs beyond what is allocated before it (its
    peak over the allocator's live bytes; the cache emptied first, so no freed block
    hides it)."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def synchronize(device: str) -> None:
    if device != "cpu":
        import torch

        torch.cuda.synchronize()


def time_device(fn: Callable[[], Any], device: str, policy: TimingPolicy) -> Timing:
    """Median time of one call of `fn` (already warmed up by the caller or by do_bench)."""
    if device == "cpu":
        return _time_cpu(fn, policy)
    from triton.testing import do_bench, do_bench_cudagraph

    if policy.graph:
        # GPU time alone: replays of a captured CUDA/HIP graph leave the host's launch
        # cost out, which otherwise dominates ops shorter than ~0.1 ms on a slow host
        # (host cost is measured separately, in the overhead section).
        try:
            ms = do_bench_cudagraph(fn, rep=policy.rep_ms, return_mode="median")
            return Timing(median_ms=float(ms), method="cudagraph", calls=0)
        except Exception:  # not capturable (e.g. a host sync inside): time it eagerly
            pass
    # do_bench records device events around each call and clears the L2 cache between
    # calls (outside the timed region); "median" resists the odd slow launch.
    ms = do_bench(fn, warmup=policy.warmup_ms, rep=policy.rep_ms, return_mode="median")
    return Timing(median_ms=float(ms), method="do_bench", calls=0)


def _time_cpu(fn: Callable[[], Any], policy: TimingPolicy) -> Timing:
    fn()  # warm-up: first-call dispatch, lazy init
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < policy.cpu_max_calls:
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
        if (
            len(samples) >= policy.cpu_min_calls
            and time.perf_counter() - start > policy.cpu_budget_s
        ):
            break
    return Timing(
        median_ms=statistics.median(samples) * 1e3, method="perf_counter", calls=len(samples)
    )


def host_time_per_call(
    fn: Callable[[], Any],
    finish: Callable[[Any], None],
    policy: TimingPolicy,
    warmup_calls: int = 50,
) -> tuple[float, int]:
    """Microseconds of host time per call, over many back-to-back calls.

    `finish(last_result)` synchronizes once at the end (device sync, block_until_ready), so
    the figure is max(host cost, device cost) per call: for a tiny input, the binding's
    dispatch and launch cost. The call count adapts so slow paths (the interpreter) stay
    within the budget.
    """
    result = None
    for _ in range(warmup_calls):
        result = fn()
    finish(result)
    # Calibrate: how many calls fit the budget at the warmed-up rate.
    t0 = time.perf_counter()
    result = fn()
    finish(result)
    one = max(time.perf_counter() - t0, 1e-7)
    calls = int(max(10, min(policy.overhead_calls, policy.overhead_budget_s / one)))
    t0 = time.perf_counter()
    for _ in range(calls):
        result = fn()
    finish(result)
    return (time.perf_counter() - t0) / calls * 1e6, calls
