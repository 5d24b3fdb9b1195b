from __future__ import annotations

from typing import Any

from greta_core import configs
from greta_core.configs.blocks import kv_cache_blocks
from greta_core.kernels.kv_cache import kv_cache_append_kernel
from greta_core.ops import _interp_compat
from greta_core.ops._plan import Buffer, In, Launch, Out, Plan, Wrap, dtype_name, memo, run
from greta_core.ops._plan import _identity as _no_wrap
from greta_core.ops._rows import arch_for, float_dtypes
from greta_core.ops._validate import GretaInputError, check_same_device, check_tensor

OP = "kv_cache_append"
_interp_compat.apply()


def validate(
    k_cache: Any, v_cache: Any, k: Any, v: Any, cache_lens: Any, reference: bool = False
) -> str:
    """Check the inputs; returns the arch to launch on. Raises GretaInputError."""
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
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        # A broadcast (stride-0) cache would have every row written through one memory slot.
        if any(st == 0 and n > 1 for st, n in zip(t.stride(), t.shape, strict=True)):
            raise GretaInputError(
                f"{OP}: argument '{name}' has a zero stride (an expanded view); the cache is "
                "written in place and needs its own memory (call .contiguous() first)"
            )
    check_same_device(OP, k_cache=k_cache, v_cache=v_cache, k=k, v=v, cache_lens=cache_lens)
    return arch_for(OP, k_cache, reference)


def check_capacity(cache_lens: Any, new_tokens: int, max_seq: int) -> None:
    """Host-side overflow check; reads cache_lens (a device sync when it lives on a GPU)."""
    if cache_lens.numel():
        check_lengths(int(cache_lens.min()), int(cache_lens.max()), new_tokens, max_seq)


def check_lengths(lo: int, hi: int, new_tokens: int, max_seq: int) -> None:
    """The capacity rule on the smallest and largest length, as Python ints: int32 sums
    (a framework's) would wrap near 2**31 and let an overflow through."""
    if lo < 0:
        raise GretaInputError(f"{OP}: argument 'cache_lens' holds a negative length ({lo})")
    if hi + new_tokens > max_seq:
        raise GretaInputError(
            f"{OP}: appending {new_tokens} tokens to a cache of length {hi} overflows max_seq "
            f"{max_seq} (argument 'cache_lens')"
        )


# --- the launch plan: inputs (k_cache, v_cache, k, v, cache_lens) -------------------------


@memo
def plan(
    cache_shape: tuple[int, ...], n_new: int,
    strides: tuple[tuple[int, ...], ...], dtype: str, arch: str,
) -> Plan:  # fmt: skip
    """`strides`: the [:3] strides of k, v, k_cache, v_cache. Buffers: the caches (updated in
    place) and new_lens int32 [batch]."""
    batch, heads, max_seq, head_dim = cache_shape
    config = configs.lookup(OP, arch, {"new_tokens": n_new})
    block_t, block_d = kv_cache_blocks(config, n_new, head_dim)
    launch = Launch(
        kv_cache_append_kernel,
        (batch * heads, (max(n_new, 1) + block_t - 1) // block_t),  # n_new = 0: new_lens only
        (In(2), In(3), In(4), In(0), In(1), heads, n_new, max_seq, head_dim,
         *(s for st in strides for s in st), Out(0), Out(1), Out(2)),
        {"BLOCK_T": block_t, "BLOCK_D": block_d}, configs.launch_options(config, arch),
    )  # fmt: skip
    buffers = (
        Buffer(cache_shape, dtype, alias=0),
        Buffer(cache_shape, dtype, alias=1),
        Buffer((batch,), "int32"),
    )
    return Plan(OP, arch, buffers, (launch,) if batch * heads else (), (0, 1, 2))


def launch(
    k_cache: Any, v_cache: Any, k: Any, v: Any, cache_lens: Any, new_lens: Any, arch: str,
    wrap: Wrap = _no_wrap,
) -> None:  # fmt: skip
    """Append in place; writes the new lengths into the preallocated `new_lens`."""
    strides = tuple(tuple(t.stride()[:3]) for t in (k, v, k_cache, v_cache))
    p = plan(tuple(k_cache.shape), k.shape[2], strides, dtype_name(k_cache.dtype), arch)
    run(p, (k_cache, v_cache, k, v, cache_lens), out=(k_cache, v_cache, new_lens), wrap=wrap)


def kv_cache_append(
    k_cache: Any, v_cache: Any, k: Any, v: Any, cache_lens: Any, *, check: bool | None = None,
    wrap: Wrap = _no_wrap,
) -> Any:  # fmt: skip
    """Write k/v [batch, heads_kv, new_tokens, head_dim] into k_cache/v_cache [batch, heads_kv,
    max_seq, head_dim] at cache_lens[b] + t, in place; returns the new lengths (int32 [batch]).

    ``check``: overflow check on the host (None: only when cache_lens is on the CPU, where it
    is free; True also on a GPU, at the cost of a sync). Without it, tokens past max_seq are
    dropped by the kernel, never written out of bounds.

    Raises GretaInputError for a wrong shape, dtype, device or layout, a broadcast cache, or
    (when checked) a negative length or an overflow.
    """
    arch = validate(k_cache, v_cache, k, v, cache_lens)
    if check or (check is None and cache_lens.device.type == "cpu"):
        check_capacity(cache_lens, k.shape[2], k_cache.shape[2])
    strides = tuple(tuple(t.stride()[:3]) for t in (k, v, k_cache, v_cache))
    p = plan(tuple(k_cache.shape), k.shape[2], strides, dtype_name(k_cache.dtype), arch)
    return run(p, (k_cache, v_cache, k, v, cache_lens), wrap=wrap)[2]
