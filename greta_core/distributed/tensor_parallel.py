"""Megatron-style sharding of (in, out) weight matrices, and the one sum each sublayer needs.

A column-parallel linear splits the output features: every rank computes its own slice
of ``x @ W`` with no communication (QKV, gate/up). A row-parallel linear splits the input
features: every rank computes a partial ``x_r @ W_r`` and an all-reduce adds them (the
attention output projection, the MLP down projection). Chaining column then row parallel
costs one all-reduce per sublayer.

Fused weights (``[q | k | v]``, ``[gate | up]``) are sharded part by part, so rank r gets
its own q heads with the k/v heads they attend to, and matching gate and up columns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from greta_core.errors import GretaError


class GretaShardingError(GretaError, ValueError):
    """A shape that does not split evenly over the ranks, or a malformed weight layout."""


def shard_size(total: int, world: int, what: str) -> int:
    if world < 1:
        raise GretaShardingError(f"world size must be at least 1, got {world}")
    if total % world:
        raise GretaShardingError(f"{what} = {total} does not split over {world} ranks")
    return total // world


def _check_rank(rank: int, world: int) -> None:
    if not 0 <= rank < world:
        raise GretaShardingError(f"rank {rank} is outside 0..{world - 1}")


def column_shard(w: Any, rank: int, world: int, parts: Sequence[int] | None = None) -> Any:
    """This rank's output columns of ``w`` (in, out); each part of a fused ``w`` split evenly."""
    _check_rank(rank, world)
    if w.ndim != 2:
        raise GretaShardingError(
            f"column_shard wants an (in, out) matrix, got shape {tuple(w.shape)}"
        )
    parts = list(parts) if parts is not None else [w.shape[1]]
    if sum(parts) != w.shape[1]:
        raise GretaShardingError(f"parts {parts} do not add up to the {w.shape[1]} columns")
    pieces, start = [], 0
    for n, size in enumerate(parts):
        step = shard_size(size, world, f"part {n} of the columns")
        pieces.append(w[:, start + rank * step : start + (rank + 1) * step])
        start += size
    import torch

    return torch.cat(pieces, dim=1).contiguous()


def row_shard(w: Any, rank: int, world: int) -> Any:
    """This rank's input rows of ``w`` (in, out)."""
    _check_rank(rank, world)
    if w.ndim != 2:
        raise GretaShardingError(f"row_shard wants an (in, out) matrix, got shape {tuple(w.shape)}")
    step = shard_size(w.shape[0], world, "rows")
    return w[rank * step : (rank + 1) * step].contiguous()


def all_reduce_(t: Any, group: Any = None) -> Any:
    """Sum ``t`` in place over the group (a no-op outside torch.distributed or alone)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(t, group=group)
    return t


def shard_llama_weights(
    weights: Mapping[str, Any],
    *,
    heads: int,
    kv_heads: int,
    head_dim: int,
    hidden: int,
    rank: int,
    world: int,
) -> dict[str, Any]:
    """A Llama block's weights for one rank: ``wqkv`` and ``w13`` by columns, ``wo`` and ``w2``
    by rows, norms replicated. Names follow examples/llama_block.py."""
    shard_size(heads, world, "attention heads")
    shard_size(kv_heads, world, "key/value heads")
    shard_size(hidden, world, "MLP width")
    q, kv = heads * head_dim, kv_heads * head_dim
    out = {k: v for k, v in weights.items() if k not in ("wqkv", "wo", "w13", "w2")}
    out["wqkv"] = column_shard(weights["wqkv"], rank, world, [q, kv, kv])
    out["wo"] = row_shard(weights["wo"], rank, world)
    out["w13"] = column_shard(weights["w13"], rank, world, [hidden, hidden])
    out["w2"] = row_shard(weights["w2"], rank, world)
    return out
