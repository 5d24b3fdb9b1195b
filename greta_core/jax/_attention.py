from __future__ import annotations

import functools
import math
from typing import Any

from greta_core.jax._runtime import jax_arch, use_triton
from greta_core.observe import record

HEAD_DIMS = (64, 128)


def _check(q: Any, k: Any, v: Any, q_lens: Any | None, kv_lens: Any | None) -> None:
    if q.ndim != 4 or k.ndim != 4 or v.shape != k.shape:
        raise ValueError(
            f"attention: arguments 'q' {q.shape}, 'k' {k.shape}, 'v' {v.shape} must be "
            "[B, H, S, D] with k and v of one shape"
        )
    if k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
        raise ValueError(f"attention: argument 'k' {k.shape} does not fit q {q.shape}")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1] != 0:
        raise ValueError(
            f"attention: argument 'k' has {k.shape[1]} heads; q's {q.shape[1]} must be a multiple"
        )
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"attention: arguments 'k', 'v' must have q's dtype {q.dtype}")
    for name, lens in (("q_lens", q_lens), ("kv_lens", kv_lens)):
        if lens is not None and (lens.shape != (q.shape[0],) or str(lens.dtype) != "int32"):
            raise ValueError(f"attention: argument '{name}' must be int32 of shape ({q.shape[0]},)")


def reference(
    q: Any,
    k: Any,
    v: Any,
    causal: bool = False,
    scale: float | None = None,
    q_lens: Any | None = None,
    kv_lens: Any | None = None,
) -> tuple[Any, Any]:
    """(o, logsumexp) with the kernel's semantics, in jax.numpy (fp32 math)."""
    import jax.numpy as jnp

    batch, heads, seq_q, dim = q.shape
    seq_kv = k.shape[2]
    group = heads // k.shape[1]
    scale = 1.0 / math.sqrt(dim) if scale is None else float(scale)
    acc = jnp.promote_types(q.dtype, jnp.float32)
    kx = jnp.repeat(k.astype(acc), group, axis=1)
    vx = jnp.repeat(v.astype(acc), group, axis=1)
    scores = jnp.einsum("bhqd,bhkd->bhqk", q.astype(acc), kx) * scale
    ql = jnp.full((batch,), seq_q) if q_lens is None else jnp.minimum(q_lens, seq_q)
    kl = jnp.full((batch,), seq_kv) if kv_lens is None else jnp.minimum(kv_lens, seq_kv)
    i = jnp.arange(seq_q)
    j = jnp.arange(seq_kv)
    vis = (j[None, None, :] < kl[:, None, None]) & (i[None, :, None] < ql[:, None, None])
    if causal:
        pos = (kl - ql)[:, None] + i[None, :]
        vis = vis & (j[None, None, :] <= pos[:, :, None])
    scores = jnp.where(vis[:, None], scores, -jnp.inf)
    row_max = jnp.max(scores, axis=-1, keepdims=True)
    row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
    expd = jnp.exp(scores - row_max)
    total = expd.sum(-1, keepdims=True)
    probs = jnp.where(total > 0, expd / jnp.where(total > 0, total, 1.0), 0.0)
    lse = jnp.where(total[..., 0] > 0, jnp.log(total[..., 0]) + row_max[..., 0], -jnp.inf)
    out = jnp.einsum("bhqk,bhkd->bhqd", probs, vx)
    return out.astype(q.dtype), lse.astype(jnp.float32)


def _triton_ok(q: Any) -> bool:
    """The Triton kernels take this call: a GPU backend, fp16/bf16, head dim 64/128, rows."""
    import jax.numpy as jnp

    return (
        use_triton()
        and jnp.dtype(q.dtype) in (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))
        and q.shape[3] in HEAD_DIMS
        and q.shape[0] * q.shape[1] * q.shape[2] > 0
    )


def _triton(
    q: Any, k: Any, v: Any, causal: bool, scale: float | None, q_lens: Any, kv_lens: Any
) -> tuple[Any, Any]:
    import jax
    import jax.numpy as jnp
    import jax_triton as jt

    from greta_core import configs
    from greta_core.kernels.attention import attention_fwd_kernel, features, grid

    arch = jax_arch()
    batch, heads, seq_q, dim = q.shape
    heads_kv, seq_kv = k.shape[1], k.shape[2]
    has_lens = q_lens is not None or kv_lens is not None
    if has_lens:
        q_lens = jnp.full((batch,), seq_q, jnp.int32) if q_lens is None else q_lens
        kv_lens = jnp.full((batch,), seq_kv, jnp.int32) if kv_lens is None else kv_lens
    config = configs.lookup("attention", arch, features(dim, seq_q, seq_kv, causal))
    meta = configs.meta_params(config)
    record("attention", "jax-triton", arch)
    # Contiguous [B, H, S, D] arrays: strides follow from the shapes.
    q_strides = (heads * seq_q * dim, seq_q * dim, dim)
    kv_strides = (heads_kv * seq_kv * dim, seq_kv * dim, dim)
    out, lse = jt.triton_call(
        q,
        k,
        v,
        q_lens if has_lens else q,  # never read when HAS_LENS is False
        kv_lens if has_lens else q,
        1.0 / math.sqrt(dim) if scale is None else float(scale),
        seq_q,
        seq_kv,
        heads,
        heads // heads_kv,
        *q_strides,
        *kv_strides,
        *kv_strides,
        *q_strides,
        kernel=attention_fwd_kernel,
        out_shape=[
            jax.ShapeDtypeStruct(q.shape, q.dtype),
            jax.ShapeDtypeStruct((batch, heads, seq_q), jnp.float32),
        ],
        grid=grid(batch, heads, seq_q, meta["BLOCK_M"]),
        num_warps=config.get("num_warps", 4),
        num_stages=config.get("num_stages", 3),
        HEAD_DIM=dim,
        BLOCK_M=meta["BLOCK_M"],
        BLOCK_N=meta["BLOCK_N"],
        CAUSAL=bool(causal),
        HAS_LENS=has_lens,
        UPCAST=False,
    )
    return out, lse


def attention_with_lse(
    q: Any,
    k: Any,
    v: Any,
    causal: bool = False,
    scale: float | None = None,
    q_lens: Any | None = None,
    kv_lens: Any | None = None,
) -> tuple[Any, Any]:
    """(o [B, Hq, Sq, D], logsumexp [B, Hq, Sq] fp32); forward only."""

    _check(q, k, v, q_lens, kv_lens)
    if _triton_ok(q):
        return _triton(q, k, v, causal, scale, q_lens, kv_lens)
    record("attention", "reference-jnp")
    return reference(q, k, v, causal, scale, q_lens, kv_lens)


def _triton_bwd(
    do: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, causal: bool, scale: float | None
) -> tuple[Any, Any, Any]:
    """(dq, dk, dv) with the Triton FlashAttention-2 backward kernels (no per-batch lengths)."""
    import jax
    import jax.numpy as jnp
    import jax_triton as jt

    from greta_core.kernels.attention_bwd import attention_bwd_dkdv_kernel, attention_bwd_dq_kernel
    from greta_core.ops.attention_bwd import kernel_configs

    arch = jax_arch()
    batch, heads, seq_q, dim = q.shape
    heads_kv, seq_kv = k.shape[1], k.shape[2]
    delta = jnp.sum(out.astype(jnp.float32) * do.astype(jnp.float32), axis=-1)
    q_strides = (heads * seq_q * dim, seq_q * dim, dim)
    kv_strides = (heads_kv * seq_kv * dim, seq_kv * dim, dim)
    args = (
        q, k, v, do, lse, delta,
        1.0 / math.sqrt(dim) if scale is None else float(scale),
        seq_q, seq_kv, heads, heads // heads_kv,
        *q_strides, *kv_strides, *kv_strides, *q_strides,
    )  # fmt: skip
    common = {"HEAD_DIM": dim, "CAUSAL": bool(causal), "UPCAST": False}
    dkdv_cfg, dq_cfg = kernel_configs(arch, dim)
    record("attention_bwd", "jax-triton", arch)

    per_head = jax.ShapeDtypeStruct((batch, heads, seq_kv, dim), jnp.float32)
    dk, dv = jt.triton_call(
        *args,
        kernel=attention_bwd_dkdv_kernel,
        out_shape=[per_head, per_head],
        grid=(-(-seq_kv // dkdv_cfg["BLOCK_N"]), batch * heads),
        **common,
        **dkdv_cfg,  # block sizes + num_warps/num_stages
    )
    dq = jt.triton_call(
        *args,
        kernel=attention_bwd_dq_kernel,
        out_shape=jax.ShapeDtypeStruct(q.shape, jnp.float32),
        grid=(-(-seq_q // dq_cfg["BLOCK_M"]), batch * heads),
        **common,
        **dq_cfg,  # block sizes + num_warps/num_stages
    )
    group = heads // heads_kv
    dk = dk.reshape(batch, heads_kv, group, seq_kv, dim).sum(2)
    dv = dv.reshape(batch, heads_kv, group, seq_kv, dim).sum(2)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


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
    q: Any,
    k: Any,
    v: Any,
    causal: bool = False,
    scale: float | None = None,
    q_lens: Any | None = None,
    kv_lens: Any | None = None,
) -> Any:
    """softmax(q k^T * scale) v; same semantics as torch.ops.greta.attention.

    Differentiable: without lengths, on the Triton path, through the Triton backward
    kernels (``jax.custom_vjp``); otherwise through JAX's autodiff of the jnp reference.
    """

    _check(q, k, v, q_lens, kv_lens)
    if q_lens is None and kv_lens is None and _triton_ok(q) and k.shape[2] > 0:
        return _differentiable(bool(causal), None if scale is None else float(scale))(q, k, v)
    return attention_with_lse(q, k, v, causal, scale, q_lens, kv_lens)[0]
