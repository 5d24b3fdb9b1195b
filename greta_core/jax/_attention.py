from __future__ import annotations

import functools
from typing import Any

from greta_core.errors import GretaInputError
from greta_core.jax._rows_common import check_float
from greta_core.jax._runtime import jax_arch, use_triton
from greta_core.observe import record
from greta_core.reference import attention_with_lse as reference


def _check(q: Any, k: Any, v: Any, q_lens: Any | None, kv_lens: Any | None) -> None:
    """Raises GretaInputError for shapes, dtypes or lengths the op does not take."""
    import jax

    check_float("attention", "q", q)
    if q.ndim != 4 or k.ndim != 4 or v.shape != k.shape:
        raise GretaInputError(
            f"attention: arguments 'q' {q.shape}, 'k' {k.shape}, 'v' {v.shape} must be "
            "[B, H, S, D] with k and v of one shape"
        )
    if k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
        raise GretaInputError(f"attention: argument 'k' {k.shape} does not fit q {q.shape}")
    if q.shape[3] == 0:  # the default scale is 1/sqrt(D), as in the torch binding
        raise GretaInputError(
            f"attention: argument 'q' has shape {tuple(q.shape)}; its head dim must be >= 1"
        )
    if k.shape[1] == 0 or q.shape[1] % k.shape[1] != 0:
        raise GretaInputError(
            f"attention: argument 'k' has {k.shape[1]} heads; q's {q.shape[1]} must be a multiple"
        )
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise GretaInputError(f"attention: arguments 'k', 'v' must have q's dtype {q.dtype}")
    for name, lens in (("q_lens", q_lens), ("kv_lens", kv_lens)):
        if lens is None:
            continue
        if lens.shape != (q.shape[0],) or str(lens.dtype) != "int32":
            raise GretaInputError(
                f"attention: argument '{name}' must be int32 of shape ({q.shape[0]},)"
            )
        if not isinstance(lens, jax.core.Tracer) and lens.size and int(lens.min()) < 0:
            raise GretaInputError(
                f"attention: argument '{name}' holds a negative length ({int(lens.min())})"
            )


def _triton_ok(q: Any, k: Any) -> bool:
    """The Triton kernels take this call: a GPU backend, fp16/bf16, head dim 64/128, keys."""
    import jax.numpy as jnp

    from greta_core.ops.attention import HEAD_DIMS

    return (
        use_triton()
        and jnp.dtype(q.dtype) in (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))
        and q.shape[3] in HEAD_DIMS
        and k.shape[2] > 0
    )


def _contiguous_strides(a: Any) -> tuple[int, int, int]:
    _, heads, seq, dim = a.shape
    return (heads * seq * dim, seq * dim, dim)


def _triton(
    q: Any, k: Any, v: Any, causal: bool, scale: float | None, q_lens: Any, kv_lens: Any
) -> tuple[Any, Any]:
    from greta_core.jax._plan import run
    from greta_core.ops.attention import lens_key, plan_fwd

    strides = (_contiguous_strides(q), _contiguous_strides(k), _contiguous_strides(v))
    plan = plan_fwd(
        q.shape, (k.shape[1], k.shape[2]), strides, str(q.dtype), bool(causal),
        None if scale is None else float(scale), lens_key(q_lens, kv_lens), jax_arch(),
    )  # fmt: skip
    return run(plan, (q, k, v, *(t for t in (q_lens, kv_lens) if t is not None)))


def attention_with_lse(
    q: Any, k: Any, v: Any, causal: bool = False, scale: float | None = None,
    q_lens: Any | None = None, kv_lens: Any | None = None,
) -> tuple[Any, Any]:  # fmt: skip
    """(o [B, Hq, Sq, D], logsumexp [B, Hq, Sq] fp32); forward only."""

    _check(q, k, v, q_lens, kv_lens)
    if _triton_ok(q, k):
        return _triton(q, k, v, causal, scale, q_lens, kv_lens)
    record("attention", "reference-jnp")
    return reference(q, k, v, causal, scale, q_lens, kv_lens)


def _triton_bwd(
    do: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, causal: bool, scale: float | None
) -> tuple[Any, Any, Any]:
    """(dq, dk, dv) in q's dtype, dk/dv per KV head, with the Triton FlashAttention-2
    backward kernels (no per-batch lengths)."""
    from greta_core.jax._plan import run
    from greta_core.ops.attention_bwd import plan

    strides = tuple(_contiguous_strides(a) for a in (q, k, v, do, out))
    p = plan(
        q.shape, (k.shape[1], k.shape[2]), strides, str(q.dtype), bool(causal),
        None if scale is None else float(scale), jax_arch(),
    )  # fmt: skip
    return run(p, (q, k, v, do, lse, out))


@functools.lru_cache(maxsize=64)
def _differentiable(causal: bool, scale: float | None) -> Any:
    """attention(q, k, v) with the Triton forward and backward, as one jax.custom_vjp."""
    import jax

    @jax.custom_vjp
    def f(q: Any, k: Any, v: Any) -> Any:
        return _triton(q, k, v, causal, scale, None, None)[0]

    def fwd(q: Any, k: Any, v: Any) -> tuple[Any, Any]:
        out, lse = _triton(q, k, v, causal, scale, None, None)
        return out, (q, k, v, out, lse)

    def bwd(res: Any, do: Any) -> tuple[Any, Any, Any]:
        q, k, v, out, lse = res
        return _triton_bwd(do, q, k, v, out, lse, causal, scale)

    f.defvjp(fwd, bwd)
    return f


def attention(
    q: Any, k: Any, v: Any, causal: bool = False, scale: float | None = None,
    q_lens: Any | None = None, kv_lens: Any | None = None,
) -> Any:  # fmt: skip
    """softmax(q k^T * scale) v; same semantics as torch.ops.greta.attention.

    Differentiable: without lengths, on the Triton path, through the Triton backward
    kernels (``jax.custom_vjp``); otherwise through JAX's autodiff of the jnp reference.
    """

    _check(q, k, v, q_lens, kv_lens)
    if q_lens is None and kv_lens is None and _triton_ok(q, k):
        return _differentiable(bool(causal), None if scale is None else float(scale))(q, k, v)
    return attention_with_lse(q, k, v, causal, scale, q_lens, kv_lens)[0]
