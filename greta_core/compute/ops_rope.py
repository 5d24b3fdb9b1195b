"""Rotary embedding (rotate-half) and the in-place KV-cache append."""

from __future__ import annotations

from typing import Any

from greta_core.compute import _probes as p
from greta_core.compute._declared import entry
from greta_core.compute.registry import Impl, add, define
from greta_core.ops.rope import ROPE as DECL_ROPE

# --- rope: x [B, S, H, D] token-major, cos/sin [S, D/2]: derived from its declaration ----

ROPE = entry(DECL_ROPE, "plain torch math (no vendor library has a rope routine)")
_rope_info = ROPE.info

# --- kv_cache_append: caches [B, Hkv, max_seq, D], new [B, Hkv, S, D], lens int32 [B] ---


def _kv_info(k_cache: Any, v_cache: Any, k_new: Any, v_new: Any, cache_lens: Any) -> p.CallInfo:
    return p.info_of(k_cache, v_cache, k_new, v_new, cache_lens)


def _kv_greta(k_cache: Any, v_cache: Any, k_new: Any, v_new: Any, cache_lens: Any) -> None:
    import torch

    # A copy of the lengths: this API leaves advancing them to the caller, whatever the op does.
    torch.ops.greta.kv_cache_append(k_cache, v_cache, k_new, v_new, cache_lens.clone())


def _kv_reference(k_cache: Any, v_cache: Any, k_new: Any, v_new: Any, cache_lens: Any) -> None:
    from greta_core import reference

    reference.kv_cache_append(
        k_cache, v_cache, k_new.to(k_cache.dtype), v_new.to(v_cache.dtype), cache_lens
    )


KV = define("kv_cache_append", "write new K/V at each sequence's cache length", _kv_info)
add(
    KV,
    Impl(
        "greta",
        "greta",
        _kv_greta,
        lambda i: p.first_reason(
            p.greta_op("kv_cache_append"),
            p.dtype_in(i, p.HALF_AND_FLOAT, "the GRETA kv_cache_append kernel"),
        ),
        {"any": "GRETA Triton kv_cache_append"},
    ),
)
add(
    KV,
    Impl(
        "reference",
        "reference",
        _kv_reference,
        lambda i: p.dtype_in(i, p.FLOATS, "the reference"),
        {"any": "torch scatter_ (graph-capturable)"},
    ),
)
