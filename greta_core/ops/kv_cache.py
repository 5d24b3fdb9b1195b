"""kv_cache_append: the declaration of greta::kv_cache_append, which writes new k/v
tokens into the decode caches in place (``Tensor(a!)``: no eager front, no autograd)."""

from __future__ import annotations

import itertools
from typing import Any

from greta_core import configs, reference
from greta_core.configs.blocks import kv_cache_blocks
from greta_core.ops import _interp_compat
from greta_core.ops._plan import Buffer, In, Launch, Out, Plan, Wrap, _identity, memo
from greta_core.ops._rows import TRITON_DTYPE_NAMES, arch_for, check_array_float, float_dtypes
from greta_core.ops._validate import (
    GretaInputError,
    check_same_device,
    check_same_shape,
    check_tensor,
)
from greta_core.ops.declare import Meta, OpDecl, declare

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
    check_same_shape(OP, k_cache=k_cache, v_cache=v_cache)
    for name, t in (("k", k), ("v", v)):
        if (t.shape[0], t.shape[1], t.shape[3]) != (batch, heads, head_dim):
            raise GretaInputError(
                f"{OP}: argument '{name}' has shape {tuple(t.shape)}; expected "
                f"({batch}, {heads}, new_tokens, {head_dim})"
            )
    check_same_shape(OP, k=k, v=v)
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
    """Host-side overflow check; reads cache_lens (a device sync when it lives on a GPU).
    Torch tensors and concrete JAX arrays alike."""
    if cache_lens.shape[0]:
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
    from greta_core.kernels.kv_cache import kv_cache_append_kernel  # plans import no Triton

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


def plan_metas(arch: str, k_cache: Meta, v_cache: Meta, k: Meta, v: Meta, lens: Meta) -> Plan:
    strides = tuple(t.strides[:3] for t in (k, v, k_cache, v_cache))
    return plan(k_cache.shape, k.shape[2], strides, k_cache.dtype, arch)


def _reference(k_cache: Any, v_cache: Any, k: Any, v: Any, cache_lens: Any) -> Any:
    """Torch tensors: written in place, the new lengths returned. JAX arrays (immutable):
    (k_cache, v_cache, new_lens) with ``.at[].set``, whose ``mode="drop"`` is the kernel's
    bound guard."""
    if hasattr(k_cache, "scatter_"):
        return reference.kv_cache_append(k_cache, v_cache, k, v, cache_lens)
    import jax.numpy as jnp

    batch, heads, n_new = k.shape[0], k.shape[1], k.shape[2]
    pos = cache_lens[:, None] + jnp.arange(n_new, dtype=cache_lens.dtype)  # [B, T]
    index = (jnp.arange(batch)[:, None, None], jnp.arange(heads)[None, :, None], pos[:, None, :])
    k_cache = k_cache.at[index].set(k, mode="drop")
    v_cache = v_cache.at[index].set(v, mode="drop")
    return k_cache, v_cache, cache_lens + n_new


def check_arrays(k_cache: Any, v_cache: Any, k: Any, v: Any, cache_lens: Any) -> None:

    for name, a in (("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v)):
        check_array_float(OP, name, a)
        if a.ndim != 4:
            raise GretaInputError(f"{OP}: argument '{name}' has shape {a.shape}; expected 4 dims")
        if a.dtype != k_cache.dtype:
            raise GretaInputError(
                f"{OP}: argument '{name}' has dtype {a.dtype}; expected {k_cache.dtype}"
            )
    batch, heads, _, d = k_cache.shape
    if v_cache.shape != k_cache.shape:
        raise GretaInputError(
            f"{OP}: argument 'v_cache' has shape {v_cache.shape}; expected {k_cache.shape}"
        )
    for name, a in (("k", k), ("v", v)):
        if (a.shape[0], a.shape[1], a.shape[3]) != (batch, heads, d) or a.shape != k.shape:
            raise GretaInputError(
                f"{OP}: argument '{name}' has shape {a.shape}; expected ({batch}, {heads}, "
                f"new_tokens, {d})"
            )
    if str(getattr(cache_lens, "dtype", "")) != "int32" or cache_lens.shape != (batch,):
        raise GretaInputError(
            f"{OP}: argument 'cache_lens' must be int32 [{batch}], got "
            f"{getattr(cache_lens, 'dtype', None)} {getattr(cache_lens, 'shape', None)}"
        )


def _aot(arch: str) -> list[tuple[Meta, ...]]:
    cases = []
    for (head_dim, n_new), dtype in itertools.product(
        ((64, 1), (128, 1), (128, 512)), TRITON_DTYPE_NAMES
    ):
        cache = Meta.contiguous((2, 8, 4096, head_dim), dtype)
        new = Meta.contiguous((2, 8, n_new, head_dim), dtype)
        cases.append((cache, cache, new, new, Meta.contiguous((2,), "int32")))
    return cases


KV_CACHE_APPEND = declare(OpDecl(
    name=OP,
    schema="Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k, Tensor v, Tensor cache_lens "
    "-> Tensor",
    describe="write new K/V at each sequence's cache length",
    validate=lambda *args, reference=False: validate(*args, reference=reference),
    plan=plan_metas,
    reference=_reference,
    check_arrays=check_arrays,
    check_values=lambda k_cache, v_cache, k, v, lens: check_capacity(
        lens, k.shape[2], k_cache.shape[2]
    ),
    front=False,
    aot_cases=_aot,
    aot_unit_ints=True,  # a decode step appends one token: n_new == 1
))  # fmt: skip


def kv_cache_append(
    k_cache: Any, v_cache: Any, k: Any, v: Any, cache_lens: Any, *, check: bool | None = None,
    wrap: Wrap = _identity,
) -> Any:  # fmt: skip
    """Write k/v [batch, heads_kv, new_tokens, head_dim] into k_cache/v_cache [batch, heads_kv,
    max_seq, head_dim] at cache_lens[b] + t, in place; returns the new lengths (int32 [batch]).

    ``check``: overflow check on the host (None: only when cache_lens is on the CPU, where it
    is free; True also on a GPU, at the cost of a sync). Without it, tokens past max_seq are
    dropped by the kernel, never written out of bounds.

    Raises GretaInputError for a wrong shape, dtype, device or layout, a broadcast cache, or
    (when checked) a negative length or an overflow.
    """
    args = (k_cache, v_cache, k, v, cache_lens)
    if check or (check is None and cache_lens.device.type == "cpu"):
        KV_CACHE_APPEND.call(*args)  # validation first (cached per signature)
        check_capacity(cache_lens, k.shape[2], k_cache.shape[2])
    return KV_CACHE_APPEND.raw(*args, wrap=wrap)
