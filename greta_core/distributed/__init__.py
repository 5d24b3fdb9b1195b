"""Tensor parallelism on torch.distributed (NCCL/RCCL, or gloo on the CPU).

GRETA does not bring its own communication: the shards run GRETA kernels, the sums between
them are torch.distributed collectives. torch is imported when these functions are used.
"""

from greta_core.distributed.preflight import cluster_preflight, collective_check
from greta_core.distributed.tensor_parallel import (
    GretaShardingError,
    all_reduce_,
    column_shard,
    row_shard,
    shard_llama_weights,
    shard_size,
)

__all__ = [
    "GretaShardingError",
    "all_reduce_",
    "cluster_preflight",
    "collective_check",
    "column_shard",
    "row_shard",
    "shard_llama_weights",
    "shard_size",
]
