"""GretaCompute: one call per operation, the best implementation this machine has.

Each op (matmul, attention, rms_norm, layer_norm, softmax, rope, kv_cache_append, conv2d)
has an ordered list of implementations — GRETA Triton kernel, vendor library through the
framework (cuBLAS/hipBLASLt, cuDNN/MIOpen, FlashAttention/AOTriton/CK), plain-torch
reference — each with a probe run at call time. The first available runs, unless forced:

    with greta_core.compute.force("attention", "sdpa-flash"): ...
    GRETA_IMPL_MATMUL=vendor   or   GRETA_IMPL=matmul=vendor,attention=reference

A forced implementation that cannot run raises GretaUnavailableError (never a substitute).
Which one ran: ``greta_core.observe.last_implementation("compute.<op>")`` or ``greta backends``.
"""

from __future__ import annotations

from typing import Any

from greta_core.compute import ops_attention, ops_conv, ops_matmul, ops_norm, ops_rope
from greta_core.compute.device import default_device, default_dtype, resolve_dtype, synchronize
from greta_core.compute.dispatch import candidates, clear_cache, run, select
from greta_core.compute.forcing import force, forced, set_impl
from greta_core.compute.registry import REGISTRY, valid_choices
from greta_core.errors import GretaConfigError, GretaUnavailableError

__all__ = [
    "REGISTRY",
    "GretaConfigError",
    "GretaUnavailableError",
    "attention",
    "candidates",
    "clear_cache",
    "conv2d",
    "default_device",
    "default_dtype",
    "force",
    "forced",
    "kv_cache_append",
    "layer_norm",
    "matmul",
    "ops",
    "resolve_dtype",
    "rms_norm",
    "rope",
    "select",
    "set_impl",
    "softmax",
    "synchronize",
    "valid_choices",
]


def ops() -> list[str]:
    """Operation names in display order."""
    from greta_core.compute.registry import ORDER

    return sorted(REGISTRY, key=lambda n: ORDER.index(n) if n in ORDER else len(ORDER))


def matmul(a: Any, b: Any, bias: Any = None) -> Any:
    """a[..., K] @ b[K, N] (+ bias[N])."""
    return run("matmul", ops_matmul._info(a, b, bias), a, b, bias)


def attention(
    q: Any,
    k: Any,
    v: Any,
    causal: bool = True,
    scale: float | None = None,
    q_lens: Any = None,
    kv_lens: Any = None,
) -> Any:
    """q [B,Hq,Sq,D], k/v [B,Hkv,Skv,D]; row i at position kv_len - q_len + i."""
    info = ops_attention._info(q, k, v, causal, scale, q_lens, kv_lens)
    return run("attention", info, q, k, v, causal, scale, q_lens, kv_lens)


def rms_norm(x: Any, weight: Any, eps: float = 1e-6) -> Any:
    return run("rms_norm", ops_norm._rms_info(x, weight, eps), x, weight, eps)


def layer_norm(x: Any, weight: Any, bias: Any, eps: float = 1e-5) -> Any:
    return run("layer_norm", ops_norm._ln_info(x, weight, bias, eps), x, weight, bias, eps)


def softmax(x: Any) -> Any:
    """Softmax over the last dim."""
    return run("softmax", ops_norm._sm_info(x), x)


def rope(x: Any, cos: Any, sin: Any) -> Any:
    """x [B,S,H,D] token-major; cos/sin [S, D/2]; rotate-half convention."""
    return run("rope", ops_rope._rope_info(x, cos, sin), x, cos, sin)


def kv_cache_append(k_cache: Any, v_cache: Any, k_new: Any, v_new: Any, cache_lens: Any) -> None:
    """Write k_new/v_new [B,Hkv,S,D] at position cache_lens[b] of each cache row (in place).

    cache_lens (int32 [B]) is read, never advanced: the caller owns it.
    """
    info = ops_rope._kv_info(k_cache, v_cache, k_new, v_new, cache_lens)
    run("kv_cache_append", info, k_cache, v_cache, k_new, v_new, cache_lens)


def conv2d(
    x: Any,
    weight: Any,
    bias: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> Any:
    info = ops_conv._info(x, weight, bias, stride, padding, dilation, groups)
    return run("conv2d", info, x, weight, bias, stride, padding, dilation, groups)
