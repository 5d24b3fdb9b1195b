"""Block-size rules: how a config entry and a problem size give the constexpr block sizes.

Both the launch plans (``greta_core.ops``) and the AOT specs (``greta_core.kernels``) use
them, so the two always agree.

Row ops (norms, softmax): a row op reads its whole row into registers when ``next_pow2(N) <= MAX_BLOCK_N`` (one
read and one write per element); longer rows loop over ``LOOP_BLOCK_N`` chunks. Both the
launch plans (``greta_core.ops._rows``) and the AOT specs (``greta_core.kernels``) use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Smallest block: keeps a warp's vector loads full even for very short rows.
MIN_BLOCK_N = 16


def _next_pow2(n: int) -> int:
    # Shifts and ors only: also works on torch.compile's symbolic sizes.
    n -= 1
    for shift in (1, 2, 4, 8, 16, 32):
        n |= n >> shift
    return n + 1


def row_block(config: Mapping[str, Any], n_cols: int) -> tuple[int, bool]:
    """(BLOCK_N, ONE_PASS) for rows of `n_cols` under `config`."""
    block = max(MIN_BLOCK_N, _next_pow2(max(n_cols, 1)))
    if block <= config["MAX_BLOCK_N"]:
        return block, True
    return config["LOOP_BLOCK_N"], False


def aot_widths(op: str, arch: str) -> list[int]:
    """Row widths whose plans pick every block the table can pick (see aot_variants)."""
    from greta_core import configs

    config = configs.lookup(op, arch, {})
    widths = []
    # From the smallest block up: short rows are real (per-head q/k norms over a head_dim of
    # 64 or 128) and a block the wheel lacks is a JIT compile on the user's first call.
    block = MIN_BLOCK_N
    while block <= config["MAX_BLOCK_N"]:
        widths.append(block)
        block *= 2
    widths.append(config["MAX_BLOCK_N"] * 2)
    return widths


def aot_variants(op: str, arch: str) -> list[tuple[int, bool, dict[str, Any]]]:
    """(BLOCK_N, ONE_PASS, launch options) for every block the table can pick: AOT specs."""
    from greta_core import configs

    out = []
    for n in aot_widths(op, arch):
        cfg = configs.lookup(op, arch, {"N": n})
        block_n, one_pass = row_block(cfg, n)
        out.append((block_n, one_pass, configs.launch_options(cfg, arch)))
    return out


def rope_blocks(config: Mapping[str, Any], n_heads: int, head_dim: int) -> tuple[int, int]:
    """(BLOCK_H, BLOCK_HALF) of RoPE: a program's tile is capped at ELEMS elements, so small
    head counts get one program per token."""
    block_half = _next_pow2(max(head_dim // 2, 1))
    block_h = max(1, min(_next_pow2(n_heads), config["ELEMS"] // (2 * block_half)))
    return block_h, block_half


def kv_cache_blocks(config: Mapping[str, Any], n_new: int, head_dim: int) -> tuple[int, int]:
    """(BLOCK_T, BLOCK_D) of kv_cache_append: a program's tile is capped at ELEMS elements."""
    block_d = _next_pow2(max(head_dim, 1))
    block_t = max(1, min(_next_pow2(max(n_new, 1)), config["ELEMS"] // block_d))
    return block_t, block_d
