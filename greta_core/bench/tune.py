"""Time candidate launch configs of an op on the current GPU and write a config table.

Offline tuning, never at run time: ``greta tune --op matmul --arch current`` runs each
candidate through the op's normal GRETA entry point (``greta_core.raw.<op>``) with
``configs.lookup`` answering the candidate for that op, times it with
``triton.testing.do_bench_cudagraph`` (median; ``do_bench`` where graphs fail), rejects candidates that fail to compile or whose
output differs from the current table's, and writes a table in the format of
``greta_core/configs/tables/<arch>.json``: the best config of the largest problem as
``default`` and one ``*_max`` rule per smaller problem whose best config differs.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from greta_core.errors import TuneError

Config = dict[str, Any]


@dataclass(frozen=True)
class Problem:
    """One shape to tune for: how to build its inputs and the features lookup() sees."""

    label: str
    features: dict[str, int]
    make: Callable[[Any, str], Callable[[], Any]]  # (torch, device) -> zero-arg call


@dataclass(frozen=True)
class OpSpace:
    op: str
    grid: dict[str, list[Any]]  # knob -> candidate values (product)
    problems: list[Problem]
    hip_grid: dict[str, list[Any]] = field(default_factory=dict)  # extra AMD knobs
    valid: Callable[[Config], bool] = lambda c: True


def candidates(space: OpSpace, is_hip: bool) -> list[Config]:
    """Every valid combination of the op's knobs (HIP-only knobs only on AMD)."""
    grid = dict(space.grid)
    if is_hip:
        grid.update(space.hip_grid)
    keys = sorted(grid)
    out = []
    for values in itertools.product(*(grid[k] for k in keys)):
        config = dict(zip(keys, values, strict=True))
        if space.valid(config):
            out.append(config)
    return out


def best_per_problem(timings: Mapping[str, Mapping[str, float]]) -> dict[str, str]:
    """problem label -> label of its fastest candidate (ignoring failed ones: inf/NaN)."""
    best = {}
    for problem, by_config in timings.items():
        valid = {c: t for c, t in by_config.items() if t == t and t != float("inf")}
        if valid:
            best[problem] = min(valid, key=lambda c: (valid[c], c))
    return best


def build_entry(
    problems: list[Problem], best: Mapping[str, Config], size_key: str
) -> dict[str, Any]:
    """Table entry: default = best of the largest problem; `<size_key>_max` rules for the
    smaller problems whose best differs, smallest first (first match wins)."""
    tuned = sorted((p for p in problems if p.label in best), key=lambda p: p.features[size_key])
    if not tuned:
        raise TuneError("no problem produced a valid timing")
    default = best[tuned[-1].label]
    rules = []
    for p in tuned[:-1]:
        if best[p.label] != default:
            rules.append(
                {"when": {f"{size_key}_max": p.features[size_key]}, "config": best[p.label]}
            )
    entry: dict[str, Any] = {"default": default}
    if rules:
        entry["rules"] = rules
    return entry


def merge_table(
    table: dict[str, Any], op: str, entry: dict[str, Any], comment: str
) -> dict[str, Any]:
    """The table with `op` replaced by the tuned entry (other ops untouched)."""
    out = json.loads(json.dumps(table))
    previous = out["ops"].get(op, {})
    entry = {"comment": comment, **entry}
    if "comment" in previous and previous["comment"] != comment:
        entry["comment"] = f"{comment} Previously: {previous['comment']}"
    # Tuning searches launch knobs only: keep the previous default's other keys (block
    # limits such as MAX_BLOCK_N), or the kernel loses parameters it needs.
    entry["default"] = {**previous.get("default", {}), **entry.get("default", {})}
    out["ops"][op] = entry
    return out


def dump_table(table: Mapping[str, Any]) -> str:
    """JSON in the shipped tables' layout: one line per op, so diffs and merges stay small."""
    head = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in table.items() if k != "ops"]
    ops = [f"    {json.dumps(op)}: {json.dumps(entry)}" for op, entry in table["ops"].items()]
    body = ",\n".join([*head, '  "ops": {\n' + ",\n".join(ops) + "\n  }"])
    return "{\n" + body + "\n}\n"


def config_label(config: Mapping[str, Any]) -> str:
    return ",".join(f"{k}={config[k]}" for k in sorted(config))


# --- the ops --------------------------------------------------------------------------


def _vec_add(n: int) -> Problem:
    def make(torch: Any, device: str) -> Callable[[], Any]:
        from greta_core import raw

        x = torch.randn(n, device=device)
        y = torch.randn(n, device=device)
        return lambda: raw.vec_add(x, y)

    return Problem(f"n={n}", {"n": n}, make)


def _matmul(m: int, n: int, k: int) -> Problem:
    def make(torch: Any, device: str) -> Callable[[], Any]:
        from greta_core import raw

        a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=device, dtype=torch.bfloat16)
        return lambda: raw.matmul(a, b)

    return Problem(f"{m}x{n}x{k}", {"M": m, "N": n, "K": k}, make)


def _rows(op: str, rows: int, cols: int) -> Problem:
    def make(torch: Any, device: str) -> Callable[[], Any]:
        from greta_core import raw

        x = torch.randn(rows, cols, device=device, dtype=torch.bfloat16)
        w = torch.randn(cols, device=device, dtype=torch.bfloat16)
        fn = getattr(raw, op)
        if op == "softmax":
            return lambda: fn(x)
        return lambda: fn(x, w)

    return Problem(f"{rows}x{cols}", {"N": cols}, make)


SPACES: dict[str, OpSpace] = {
    "vec_add": OpSpace(
        "vec_add",
        {"BLOCK": [512, 1024, 2048, 4096], "num_warps": [4, 8]},
        [_vec_add(2**16), _vec_add(2**20), _vec_add(2**24)],
    ),
    "matmul": OpSpace(
        "matmul",
        {
            "BLOCK_M": [64, 128, 256],
            "BLOCK_N": [64, 128, 256],
            "BLOCK_K": [32, 64],
            "GROUP_M": [8],
            "num_warps": [4, 8],
            "num_stages": [2, 3, 4],
        },
        [_matmul(64, 4096, 4096), _matmul(1024, 4096, 4096), _matmul(4096, 4096, 4096)],
        hip_grid={"matrix_instr_nonkdim": [16], "waves_per_eu": [0, 2], "kpack": [1]},
        valid=lambda c: c["BLOCK_M"] * c["BLOCK_N"] <= 256 * 128 or c["num_warps"] == 8,
    ),
    **{
        op: OpSpace(
            op,
            {"num_warps": [1, 2, 4, 8, 16]},
            [_rows(op, 4096, 1024), _rows(op, 4096, 4096), _rows(op, 4096, 8192)],
        )
        for op in ("rms_norm", "layer_norm", "softmax")
    },
}
SIZE_KEYS: dict[str, str] = {"vec_add": "n", "matmul": "M"}


# --- timing (GPU) ---------------------------------------------------------------------


@dataclass
class TuneRun:
    op: str
    arch: str
    timings: dict[str, dict[str, float]]  # problem -> candidate label -> ms
    configs: dict[str, Config]  # candidate label -> config
    entry: dict[str, Any]


def time_candidates(
    space: OpSpace,
    arch: str,
    device: str = "cuda",
    limit: int | None = None,
    log: Callable[[str], None] = print,
) -> TuneRun:
    """Time every candidate on every problem of `space` on the current GPU."""
    import torch
    from triton.testing import do_bench, do_bench_cudagraph

    from greta_core import configs
    from greta_core.arch import is_hip

    cands = candidates(space, is_hip(arch))[:limit]
    labels = {config_label(c): c for c in cands}
    current: dict[str, Any] = {}
    timings: dict[str, dict[str, float]] = {}
    with configs.Override({space.op: current}):
        for problem in space.problems:
            call = problem.make(torch, device)
            current.clear()
            reference = call().float()
            timings[problem.label] = {}
            for label, config in labels.items():
                current.clear()
                current.update(config)
                try:
                    out = call().float()
                    if not torch.allclose(out, reference, rtol=2e-2, atol=2e-2):
                        raise TuneError("output differs from the current config's")
                    # Replayed from a CUDA graph: small problems would otherwise time the
                    # host's launch cost, not the config (seen on the H100: 4096x1024 rows
                    # read ~60 us with do_bench for ~10 us of GPU work).
                    try:
                        ms = float(do_bench_cudagraph(call, rep=100, return_mode="median"))
                    except Exception:  # no graph capture on this backend / build
                        ms = float(do_bench(call, warmup=25, rep=100, return_mode="median"))
                except Exception as exc:  # out of resources, bad combination, wrong result
                    log(f"  {problem.label} {label}: rejected ({type(exc).__name__}: {exc})")
                    ms = float("inf")
                timings[problem.label][label] = ms
            best = min(timings[problem.label].items(), key=lambda kv: kv[1])
            log(f"{space.op} {problem.label}: best {best[0]} {best[1]:.4f} ms")
    best = {p: labels[c] for p, c in best_per_problem(timings).items()}
    entry = build_entry(space.problems, best, SIZE_KEYS.get(space.op, "N"))
    return TuneRun(space.op, arch, timings, {k: dict(v) for k, v in labels.items()}, entry)


def ops() -> Iterable[str]:
    return SPACES.keys()
