from __future__ import annotations

from collections.abc import Callable
from typing import Any

from greta_core.kernels.kv_cache import grid, kv_cache_append_kernel, plan
from greta_core.observe import record
from greta_core.ops import _interp_compat
from greta_core.ops._rows import arch_for, float_dtypes
from greta_core.ops._validate import GretaInputError, check_same_device, check_tensor

Wrap = Callable[[Any], Any]
OP = "kv_cache_append"
_interp_compat.apply()


def _identity(kernel: Any) -> Any:
    return kernel


def validate(
    k_cache: Any, v_cache: Any, k: Any, v: Any, cache_lens: Any, reference: bool = False
) -> str:
    import torch

    check_tensor(OP, "k_cache", k_cache, dtypes=float_dtypes(reference), ndim=4)
    check_tensor(OP, "v_cache", v_cache, dtypes=(k_cache.dtype,), ndim=4)
    check_tensor(OP, "k", k, dtypes=(k_cache.dtype,), ndim=4)
    check_tensor(OP, "v", v, dtypes=(k_cache.dtype,), ndim=4)
    check_tensor(OP, "cache_lens", cache_lens, dtypes=(torch.int32,), ndim=1, contiguous=True)
    batch, heads, _, head_dim = k_cache.shape
    if tuple(v_cache.shape) != tuple(k_cache.shape):
        raise GretaInputError(
            f"{OP}: argument 'v_cache' has shape {tuple(v_cache.shape)}; expected "
            f"{tuple(k_cache.shape)} (the shape of k_cache)"
        )
    for name, t in (("k", k), ("v", v)):
        if (t.shape[0], t.shape[1], t.shape[3]) != (batch, heads, head_dim):
            raise GretaInputError(
                f"{OP}: argument '{name}' has shape {tuple(t.shape)}; expected "
                f"({batch}, {heads}, new_tokens, {head_dim})"
            )
    if tuple(v.shape) != tuple(k.shape):
        raise GretaInputError(
            f"{OP}: arguments 'k' {tuple(k.shape)} and 'v' {tuple(v.shape)} differ"
        )
    if cache_lens.shape[0] != batch:
        raise GretaInputError(
            f"{OP}: argument 'cache_lens' has {cache_lens.shape[0]} entries; expected {batch}"
        )
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v)):
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            raise GretaInputError(f"{OP}: argument '{name}' must be contiguous in its last dim")
    check_same_device(OP, k_cache=k_cache, v_cache=v_cache, k=k, v=v, cache_lens=cache_lens)
    return arch_for(OP, k_cache, reference)


def check_capacity(cache_lens: Any, new_tokens: int, max_seq: int) -> None:
    """Host-side overflow check; reads cache_lens (a device sync when it lives on a GPU)."""
    if cache_lens.numel() == 0:
        return
    lo = int(cache_lens.min())
    hi = int(cache_lens.max())
    if lo < 0:
        raise GretaInputError(f"{OP}: argument 'cache_lens' holds a negative length ({lo})")
    if hi + new_tokens > max_seq:
        raise GretaInputError(
            f"{OP}: appending {new_tokens} tokens to a cache of length {hi} overflows max_seq "
            f"{max_seq} (argument 'cache_lens')"
        )


def launch(
    k_cache: Any, v_cache: Any, k: Any, v: Any, cache_lens: Any, new_lens: Any, arch: str,
    wrap: Wrap = _identity,
) -> None:  # fmt: skip
    batch, heads, max_seq, head_dim = k_cache.shape
    n_new = k.shape[2]
    if batch == 0 or heads == 0:
        return
    block_t, block_d, options = plan(arch, n_new, head_dim)
    wrap(kv_cache_append_kernel)[grid(batch, heads, max(n_new, 1), block_t)](
        k, v, cache_lens, k_cache, v_cache, heads, n_new, max_seq, head_dim,
        *k.stride()[:3], *v.stride()[:3], *k_cache.stride()[:3], *v_cache.stride()[:3],
        k_cache, v_cache, new_lens,
        BLOCK_T=block_t, BLOCK_D=block_d, **options,
    )  # fmt: skip
    record(OP, "triton-interpret" if arch == "cpu" else "triton", arch)


def kv_cache_append(
    k_cache: Any, v_cache: Any, k: Any, v: Any, cache_lens: Any, *, check: bool | None = None
) -> Any:
    """Write k/v [batch, heads_kv, new_tokens, head_dim] into k_cache/v_cache [batch, heads_kv,
    max_seq, head_dim] at cache_lens[b] + t, in place; returns the new lengths (int32 [batch]).

    ``check``: overflow check on the host (None: only when cache_lens is on the CPU, where it
    is free; True also on a GPU, at the cost of a sync). Without it, tokens past max_seq are
    dropped by the kernel, never written out of bounds.
    """
    import torch

    arch = validate(k_cache, v_cache, k, v, cache_lens)
    if check or (check is None and cache_lens.device.type == "cpu"):
        check_capacity(cache_lens, k.shape[2], k_cache.shape[2])
    new_lens = torch.empty_like(cache_lens)
    launch(k_cache, v_cache, k, v, cache_lens, new_lens, arch)
    return new_lens
