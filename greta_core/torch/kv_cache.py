"""greta::kv_cache_append: in-place append of new k/v tokens to the decode caches."""

from __future__ import annotations

import torch
from torch.library import triton_op, wrap_triton

from greta_core import reference
from greta_core.ops import kv_cache as raw
from greta_core.torch._common import record_reference
from greta_core.torch._norms_common import run_triton_on_cpu, takes_reference


def _reference(k_cache, v_cache, k, v, cache_lens) -> torch.Tensor:
    raw.validate(k_cache, v_cache, k, v, cache_lens, reference=True)
    record_reference("kv_cache_append")
    return reference.kv_cache_append(k_cache, v_cache, k, v, cache_lens)


@triton_op("greta::kv_cache_append", mutates_args={"k_cache", "v_cache"})
def kv_cache_append(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache_lens: torch.Tensor,
) -> torch.Tensor:
    if takes_reference(k_cache):
        return _reference(k_cache, v_cache, k, v, cache_lens)
    # No host-side overflow check here (it would sync every decode step): tokens past
    # max_seq are dropped by the kernel. raw.kv_cache_append(check=True) checks.
    return raw.kv_cache_append(k_cache, v_cache, k, v, cache_lens, check=False, wrap=wrap_triton)


@kv_cache_append.register_kernel("cpu")
def _kv_cache_append_cpu(k_cache, v_cache, k, v, cache_lens):
    raw.validate(k_cache, v_cache, k, v, cache_lens, reference=True)
    raw.check_capacity(cache_lens, k.shape[2], k_cache.shape[2])  # free on the CPU
    if run_triton_on_cpu(k_cache):
        return raw.kv_cache_append(k_cache, v_cache, k, v, cache_lens)
    return _reference(k_cache, v_cache, k, v, cache_lens)
