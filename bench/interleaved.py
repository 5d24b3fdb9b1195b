"""The host-time rule of the overhead benchmarks, in one place: ``bench/binding_overhead.py``
(no-grad calls) and ``bench/grad_overhead.py`` (forward+backward) both use it.

Each case is run once first (a case that fails is recorded as skipped, the others go on).
Every runnable case then gets warm-up calls, and ``rounds`` rounds each time every case
once: a batch of ``calls`` calls, the device synchronised after it, outside the timed
region, in an order rotated by one each round. A case's time is the median over rounds,
and its ratio the median of the per-round ratios to the vendor op of its group timed in the
same round: on a shared host the vendor's own time moves by 30% between runs, and
interleaving keeps that drift out of the ratio.

A sibling module, not part of ``greta_core``: ``binding_overhead.py`` is run against older
source trees (``PYTHONPATH=old``), which must not need to carry it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

Call = Callable[[], Any]
Row = dict[str, Any]
Key = tuple[str, str]  # (group, variant)


def runnable_cases(
    cases: Iterable[tuple[Row, Call | Exception | None, str]], sync: Callable[[], None]
) -> tuple[list[Row], dict[Key, Call]]:
    """Each (row, call, why not) run once. A call that is None (``why`` says why), an
    exception (building the case failed) or a call that raises leaves ``row["skipped"]``;
    the rest come back keyed by the row's (group, variant)."""
    rows: list[Row] = []
    runnable: dict[Key, Call] = {}
    for row, fn, why in cases:
        if isinstance(fn, Exception):
            row["skipped"] = f"{type(fn).__name__}: {fn}"[:200]
        elif fn is None:
            row["skipped"] = why
        else:
            try:
                fn()
                sync()
                runnable[(row["group"], row["variant"])] = fn
            except Exception as exc:  # an op this tree or device cannot run: say so, go on
                row["skipped"] = f"{type(exc).__name__}: {exc}"[:200]
        rows.append(row)
    return rows, runnable


def interleaved_host_us(
    fns: dict[Any, Call], calls: int, rounds: int, warmup: int, sync: Callable[[], None],
    device_time: bool = False,
) -> dict[Any, list[float]]:  # fmt: skip
    """Per case, its host time per call (microseconds) in each round (see the module
    docstring): a drift of the machine (clocks, other tenants) reaches every case alike,
    and a case and its vendor are timed seconds apart. `device_time`: the device is
    synchronised before the clock stops, so a call costs its host or its device time,
    whichever is larger (``bench/route_bound.py``)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    sync()
    names = list(fns)
    out: dict[Any, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        k = r % len(names) if names else 0
        for name in names[k:] + names[:k]:
            fn = fns[name]
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            if device_time:
                sync()
            out[name].append((time.perf_counter() - start) / calls * 1e6)
            sync()
    return out


def ratios_to_vendor(
    per_round: dict[Key, list[float]], variants: Iterable[str], ndigits: int
) -> dict[str, dict[str, float]]:
    """Per group and variant: the median over rounds of the variant's time over the
    ``vendor`` variant's time in the same round."""
    wanted = set(variants)
    out: dict[str, dict[str, float]] = {}
    for (group, variant), times in per_round.items():
        vendor = per_round.get((group, "vendor"))
        if variant in wanted and vendor:
            ratios = [t / v for t, v in zip(times, vendor, strict=True)]
            out.setdefault(group, {})[variant] = round(statistics.median(ratios), ndigits)
    return out


def add_times(rows: list[Row], per_round: dict[Key, list[float]]) -> None:
    """A timed row gets ``host_us_per_call`` (median over rounds) and ``host_us_min``."""
    for row in rows:
        times = per_round.get((row["group"], row["variant"]))
        if times:
            row["host_us_per_call"] = round(statistics.median(times), 2)
            row["host_us_min"] = round(min(times), 2)


def print_cases(rows: list[Row], shown: str, prefix: str = "") -> None:
    """A line per case: ``shown`` formats its time (e.g. ``"{:8.1f} us/call"``), or why it
    was skipped."""
    for row in rows:
        value = row.get("host_us_per_call")
        text = shown.format(value) if value is not None else f"skipped: {row['skipped']}"
        print(f"{prefix}{row['case']:42} {text}")
