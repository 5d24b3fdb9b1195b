"""Launch planning shared by the row-wise kernels (norms, softmax): framework-free.

A row op reads its whole row into registers when ``next_pow2(N) <= MAX_BLOCK_N`` (one
read and one write per element); longer rows loop over ``LOOP_BLOCK_N`` chunks. The
table picks ``num_warps`` (and HIP knobs) by row length.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import triton

from greta_core import configs

# Smallest block: keeps a warp's vector loads full even for very short rows.
MIN_BLOCK_N = 16


@dataclass(frozen=True)
class RowPlan:
    block_n: int
    one_pass: bool
    options: dict[str, Any]  # num_warps / num_stages (+ HIP knobs on AMD)
    config: dict[str, Any]


def row_plan(op: str, arch: str, n_cols: int) -> RowPlan:
    """The launch plan for rows of `n_cols`: memoized, as it runs on every launch.

    Keyed on `configs.lookup` itself, so `greta tune` swapping it never sees a stale
    plan; a symbolic width (torch.compile tracing) is planned without the memo.
    """
    if type(n_cols) is not int:
        return _plan(op, arch, n_cols, configs.lookup)
    return _memo_plan(op, arch, n_cols, configs.lookup)


def _plan(op: str, arch: str, n_cols: int, lookup: Any) -> RowPlan:
    config = lookup(op, arch, {"N": n_cols})
    block = max(MIN_BLOCK_N, triton.next_power_of_2(max(n_cols, 1)))
    one_pass = block <= config["MAX_BLOCK_N"]
    if not one_pass:
        block = config["LOOP_BLOCK_N"]
    return RowPlan(block, one_pass, configs.launch_options(config, arch), config)


_memo_plan = functools.lru_cache(maxsize=1024)(_plan)


def aot_blocks(op: str, arch: str) -> list[tuple[int, int]]:
    """(representative N, block) for every block size the table can pick: AOT specs."""
    config = configs.lookup(op, arch, {})
    out = []
    block = 256
    while block <= config["MAX_BLOCK_N"]:
        out.append((block, block))
        block *= 2
    out.append((config["MAX_BLOCK_N"] * 2, config["LOOP_BLOCK_N"]))
    return out


def bwd_programs(arch: str, op: str, n_rows: int, n_cols: int) -> int:
    """Programs of a backward that writes per-program weight-grad partials (deterministic)."""
    config = configs.lookup(op, arch, {"N": n_cols})
    return max(1, min(n_rows, int(config["PROGRAMS"])))
