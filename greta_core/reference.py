"""The reference maths of every GRETA op: one definition per op.

Used by the CPU kernels of ``torch.ops.greta`` (``greta_core.torch``), GretaCompute's
``reference`` implementation, the bench's correctness checks and the ``jax.numpy``
fallback of ``greta_core.jax``. Most functions take torch tensors or JAX arrays alike: they
are written once against a small array namespace (``_xp``) picked from the first argument,
so a JAX-only program runs them without torch. No validation (the callers validate); fp32
compute for every dtype but float64.
"""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class _TorchNs:
    """torch under the names the maths below uses (the array-API spellings jax.numpy has)."""

    def __init__(self) -> None:
        import torch

        self._t = torch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._t, name)

    @staticmethod
    def astype(a: Any, dtype: Any) -> Any:
        return a.to(dtype)

    @staticmethod
    def expand_dims(a: Any, axis: int) -> Any:
        return a.unsqueeze(axis)

    def arange(self, n: int, dtype: Any, like: Any) -> Any:
        return self._t.arange(n, dtype=dtype, device=like.device)

    def softmax(self, a: Any, axis: int) -> Any:
        return self._t.softmax(a, dim=axis)

    def logsumexp(self, a: Any, axis: int) -> Any:
        return self._t.logsumexp(a, dim=axis)

    def take_along_axis(self, a: Any, index: Any, axis: int) -> Any:
        return self._t.take_along_dim(a, index, dim=axis)

    def repeat(self, a: Any, repeats: int, axis: int) -> Any:
        return self._t.repeat_interleave(a, repeats, dim=axis)

    def full(self, shape: tuple[int, ...], value: Any, dtype: Any, like: Any) -> Any:
        return self._t.full(shape, value, dtype=dtype, device=like.device)


class _JaxNs:
    """jax.numpy, with the few functions it keeps under jax.lax / jax.nn."""

    def __init__(self) -> None:
        import jax
        import jax.numpy as jnp

        self._jnp = jnp
        self.rsqrt = jax.lax.rsqrt
        self.sigmoid = jax.nn.sigmoid
        self._nn = jax.nn

    def __getattr__(self, name: str) -> Any:
        return getattr(self._jnp, name)

    def arange(self, n: int, dtype: Any, like: Any) -> Any:
        return self._jnp.arange(n, dtype=dtype)

    def full(self, shape: tuple[int, ...], value: Any, dtype: Any, like: Any) -> Any:
        return self._jnp.full(shape, value, dtype=dtype)

    def softmax(self, a: Any, axis: int) -> Any:
        return self._nn.softmax(a, axis=axis)

    def logsumexp(self, a: Any, axis: int) -> Any:
        return self._nn.logsumexp(a, axis=axis)


# A dict, not functools.cache: torch.compile traces these references (bench, opcheck) and
# dynamo warns about every lru_cache wrapper it meets.
_NAMESPACES: dict[bool, Any] = {}


def _namespace(torch_like: bool) -> Any:
    ns = _NAMESPACES.get(torch_like)
    if ns is None:
        ns = _NAMESPACES[torch_like] = _TorchNs() if torch_like else _JaxNs()
    return ns


def _xp(a: Any) -> Any:
    """The namespace of `a` (an array or a dtype): torch for a torch tensor or dtype (any
    subclass), else jax.numpy. Nothing is imported to ask: a torch object means torch is
    loaded already."""
    torch = sys.modules.get("torch")
    return _namespace(torch is not None and isinstance(a, (torch.Tensor, torch.dtype)))


def compute_dtype(t: Any) -> Any:
    """float64 stays float64 (gradcheck); everything else computes in float32."""
    xp = _xp(t)
    return xp.float64 if t.dtype == xp.float64 else xp.float32


def _rows(x: Any) -> Any:
    return x.reshape(-1, x.shape[-1])


# --- rms_norm -----------------------------------------------------------------------------


def rms_norm_fwd(x: Any, weight: Any, eps: float) -> tuple[Any, Any]:
    """(y, rstd): y = x * rstd * weight over the last dim; rstd [rows] in the compute dtype."""
    xp, ct = _xp(x), compute_dtype(x)
    xf = xp.astype(_rows(x), ct)
    rstd = xp.rsqrt(xp.mean(xf * xf, axis=-1) + eps)
    y = xp.astype(xf * rstd[:, None] * xp.astype(weight, ct), x.dtype).reshape(x.shape)
    return y, rstd


def rms_norm(x: Any, weight: Any, eps: float = 1e-6) -> Any:
    return rms_norm_fwd(x, weight, eps)[0]


def rms_norm_bwd(dy: Any, x: Any, weight: Any, rstd: Any) -> tuple[Any, Any]:
    """(dx, dweight): dx = rstd * (g - xhat * mean(g * xhat)), g = weight * dy."""
    xp, ct = _xp(x), compute_dtype(x)
    r = xp.astype(rstd, ct)[:, None]
    xhat = xp.astype(_rows(x), ct) * r
    dyf = xp.astype(_rows(dy), ct)
    g = dyf * xp.astype(weight, ct)
    c = xp.mean(g * xhat, axis=-1, keepdims=True)
    dx = xp.astype((g - xhat * c) * r, x.dtype).reshape(x.shape)
    return dx, xp.astype(xp.sum(dyf * xhat, axis=0), weight.dtype)


# --- layer_norm ---------------------------------------------------------------------------


def layer_norm_fwd(x: Any, weight: Any, bias: Any | None, eps: float) -> tuple[Any, Any, Any]:
    """(y, mean, rstd): y = (x - mean) * rstd * weight + bias; mean/rstd [rows]."""
    xp, ct = _xp(x), compute_dtype(x)
    xf = xp.astype(_rows(x), ct)
    mean = xp.mean(xf, axis=-1)
    xc = xf - mean[:, None]
    rstd = xp.rsqrt(xp.mean(xc * xc, axis=-1) + eps)
    y = xc * rstd[:, None] * xp.astype(weight, ct)
    if bias is not None:
        y = y + xp.astype(bias, ct)
    return xp.astype(y, x.dtype).reshape(x.shape), mean, rstd


def layer_norm(x: Any, weight: Any, bias: Any | None = None, eps: float = 1e-5) -> Any:
    return layer_norm_fwd(x, weight, bias, eps)[0]


def layer_norm_bwd(dy: Any, x: Any, weight: Any, mean: Any, rstd: Any) -> tuple[Any, Any, Any]:
    """(dx, dweight, dbias); dbias in the weight's dtype."""
    xp, ct = _xp(x), compute_dtype(x)
    r = xp.astype(rstd, ct)[:, None]
    xhat = (xp.astype(_rows(x), ct) - xp.astype(mean, ct)[:, None]) * r
    dyf = xp.astype(_rows(dy), ct)
    g = dyf * xp.astype(weight, ct)
    c1 = xp.mean(g * xhat, axis=-1, keepdims=True)
    c2 = xp.mean(g, axis=-1, keepdims=True)
    dx = xp.astype((g - xhat * c1 - c2) * r, x.dtype).reshape(x.shape)
    dw = xp.astype(xp.sum(dyf * xhat, axis=0), weight.dtype)
    return dx, dw, xp.astype(xp.sum(dyf, axis=0), weight.dtype)


# --- softmax ------------------------------------------------------------------------------


def softmax(x: Any) -> Any:
    """Softmax over the last dim."""
    xp = _xp(x)
    return xp.astype(xp.softmax(xp.astype(x, compute_dtype(x)), axis=-1), x.dtype)


def softmax_bwd(dy: Any, y: Any) -> Any:
    """dx = y * (dy - sum(y * dy, -1))."""
    xp, ct = _xp(y), compute_dtype(y)
    yf, dyf = xp.astype(y, ct), xp.astype(dy, ct)
    return xp.astype(yf * (dyf - xp.sum(yf * dyf, axis=-1, keepdims=True)), y.dtype)


# --- vec_add ------------------------------------------------------------------------------


def vec_add(x: Any, y: Any) -> Any:
    return x + y


# --- rope ---------------------------------------------------------------------------------


def rope(x: Any, cos: Any, sin: Any, inverse: bool = False) -> Any:
    """Rotate-half RoPE of x [batch, seq, heads, d] by cos/sin [seq, d/2] or [batch|1, seq, d/2]."""
    xp, ct = _xp(x), compute_dtype(x)
    c = xp.expand_dims(xp.astype(cos, ct), -2)
    s = xp.expand_dims(xp.astype(sin, ct), -2)
    if c.ndim == 3:
        c, s = c[None], s[None]
    if inverse:
        s = -s
    half = x.shape[-1] // 2
    xf = xp.astype(x, ct)
    x1, x2 = xf[..., :half], xf[..., half:]
    return xp.astype(xp.concat([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1), x.dtype)


def rope_angles(positions: Any, theta: float, head_dim: int, dtype: Any) -> Any:
    """pos * theta^(-2i/head_dim): [..., head_dim/2]."""
    xp = _xp(positions)
    i = xp.arange(head_dim // 2, dtype, positions)
    inv_freq = theta ** (-(2.0 * i) / head_dim)
    return xp.astype(positions, dtype)[..., None] * inv_freq


def rope_positions(x: Any, positions: Any, theta: float = 10000.0, inverse: bool = False) -> Any:
    """RoPE with the angles of integer positions [seq] or [batch|1, seq]."""
    xp = _xp(x)
    ang = rope_angles(positions, theta, x.shape[-1], compute_dtype(x))
    return rope(x, xp.cos(ang), xp.sin(ang), inverse)


# --- kv_cache_append ----------------------------------------------------------------------


def kv_cache_append(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    cache_lens: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """Write k/v [B, H, T, D] into the caches [B, H, S, D] at cache_lens[b] + t, in place;
    returns the new lengths. The caller checks capacity (scatter_ raises past S).

    Torch only: JAX arrays are immutable, so ``greta_core.jax`` writes with ``.at[].set``
    (whose ``mode="drop"`` is the kernel's bound guard), not an in-place scatter."""
    import torch

    batch, heads, new_tokens, head_dim = k.shape
    pos = cache_lens.long()[:, None] + torch.arange(new_tokens, device=k.device)
    index = pos[:, None, :, None].expand(batch, heads, new_tokens, head_dim)
    # scatter_, not a Python loop over lengths: traceable under torch.compile.
    k_cache.scatter_(2, index, k)
    v_cache.scatter_(2, index, v)
    return cache_lens + new_tokens


# --- matmul -------------------------------------------------------------------------------


def acc_dtype(dtype: Any) -> Any:
    """GEMM accumulation: fp32, or wider when the inputs are."""
    xp = _xp(dtype)
    return xp.promote_types(dtype, xp.float32)


def matmul(a: Any, b: Any, bias: Any | None = None) -> Any:
    """a @ b (+ bias): fp32 (or wider) accumulation, result in the input dtype."""
    xp, acc = _xp(a), acc_dtype(a.dtype)
    out = xp.astype(a, acc) @ xp.astype(b, acc)
    if bias is not None:
        out = out + xp.astype(bias, acc)
    return xp.astype(out, a.dtype)


def bias_grad(g: Any) -> Any:
    """The gradient of matmul's bias: g's column sums, accumulated as the GEMM does."""
    xp = _xp(g)
    return xp.astype(xp.sum(xp.astype(g, acc_dtype(g.dtype)), axis=0), g.dtype)


# --- attention ----------------------------------------------------------------------------


def attention_visible(
    q: Any, k: Any, causal: bool, q_lens: Any | None = None, kv_lens: Any | None = None
) -> Any:
    """Boolean [B, 1, Sq, Skv]: which key each query row sees. Query row i < q_len sits at
    position kv_len - q_len + i (bottom-right causal); lengths clamp to [0, S]."""
    xp = _xp(q)
    batch, _, seq_q, _ = q.shape
    seq_kv = k.shape[2]
    i = xp.arange(seq_q, xp.int32, q)
    j = xp.arange(seq_kv, xp.int32, q)
    ql = xp.full((batch,), seq_q, xp.int32, q) if q_lens is None else xp.clip(q_lens, 0, seq_q)
    kl = xp.full((batch,), seq_kv, xp.int32, q) if kv_lens is None else xp.clip(kv_lens, 0, seq_kv)
    vis = (j[None, None, :] < kl[:, None, None]) & (i[None, :, None] < ql[:, None, None])
    if causal:
        pos = (kl - ql)[:, None] + i[None, :]
        vis = vis & (j[None, None, :] <= pos[:, :, None])
    return vis[:, None]


def attention_probs(
    q: Any, k: Any, causal: bool, scale: float | None,
    q_lens: Any | None = None, kv_lens: Any | None = None,
) -> tuple[Any, Any, Any, float]:  # fmt: skip
    """(P, logsumexp, k repeated to q's heads, scale), all in fp32 or wider."""
    xp = _xp(q)
    acc = acc_dtype(q.dtype)
    group = q.shape[1] // k.shape[1]
    scale = 1.0 / math.sqrt(q.shape[3]) if scale is None else float(scale)
    kx = xp.repeat(xp.astype(k, acc), group, axis=1)
    scores = (xp.astype(q, acc) @ xp.swapaxes(kx, -1, -2)) * scale
    scores = xp.where(attention_visible(q, k, causal, q_lens, kv_lens), scores, -math.inf)
    # logsumexp by hand: a row that sees no key (Skv = 0 included) then has total 0 and
    # takes finite stand-ins below, so nothing computes exp(-inf - -inf), whose NaN would
    # reach JAX's autodiff gradients through the where.
    if scores.shape[-1]:
        row_max = xp.amax(scores, axis=-1, keepdims=True)
        row_max = xp.where(xp.isneginf(row_max), 0.0, row_max)
    else:
        row_max = xp.sum(scores, axis=-1, keepdims=True)  # zeros of the row shape
    total = xp.sum(xp.exp(scores - row_max), axis=-1, keepdims=True)
    # total is exactly 0 only for a row that sees no key (probabilities 0, lse -inf); a NaN
    # (or inf) from the inputs propagates, as in SDPA.
    seen = total != 0
    lse = xp.log(xp.where(seen, total, 1.0)) + row_max
    lse = xp.where(xp.isposinf(row_max), row_max, lse)  # an inf score: lse inf, as logsumexp
    probs = xp.where(seen, xp.exp(scores - lse), 0.0)
    lse = xp.where(seen[..., 0], lse[..., 0], -math.inf)
    return probs, lse, kx, scale


def attention_with_lse(
    q: Any, k: Any, v: Any, causal: bool = False, scale: float | None = None,
    q_lens: Any | None = None, kv_lens: Any | None = None,
) -> tuple[Any, Any]:  # fmt: skip
    """(o in q's dtype, logsumexp fp32 or wider) of softmax(q k^T * scale) v, GQA."""
    xp = _xp(q)
    probs, lse, _, _ = attention_probs(q, k, causal, scale, q_lens, kv_lens)
    group = q.shape[1] // k.shape[1]
    vx = xp.repeat(xp.astype(v, probs.dtype), group, axis=1)
    if causal or q_lens is not None or kv_lens is not None:
        # A NaN value reaches only the rows that see its key, not the others through 0 * NaN.
        # (Without a mask every row sees every key: the plain product is already right.)
        v_nan = xp.isnan(vx)
        seen = xp.astype(attention_visible(q, k, causal, q_lens, kv_lens), probs.dtype)
        hits = (seen @ xp.astype(v_nan, probs.dtype)) > 0
        out = xp.where(hits, math.nan, probs @ xp.where(v_nan, 0.0, vx))
    else:
        out = probs @ vx
    return xp.astype(out, q.dtype), xp.astype(lse, acc_dtype(q.dtype))


def attention(
    q: Any, k: Any, v: Any, causal: bool = False, scale: float | None = None,
    q_lens: Any | None = None, kv_lens: Any | None = None,
) -> Any:  # fmt: skip
    return attention_with_lse(q, k, v, causal, scale, q_lens, kv_lens)[0]


def attention_bwd(
    grad: Any, q: Any, k: Any, v: Any, causal: bool, scale: float | None,
    q_lens: Any | None = None, kv_lens: Any | None = None,
) -> tuple[Any, Any, Any]:  # fmt: skip
    """(dq, dk, dv): the softmax-attention gradient (O(S^2) memory: the probabilities)."""
    xp = _xp(q)
    probs, _, kx, scale = attention_probs(q, k, causal, scale, q_lens, kv_lens)
    acc = probs.dtype
    batch, heads_kv, seq_kv, dim = k.shape
    group = q.shape[1] // heads_kv
    vx = xp.repeat(xp.astype(v, acc), group, axis=1)
    d_out = xp.astype(grad, acc)
    d_v = xp.swapaxes(probs, -1, -2) @ d_out
    d_p = d_out @ xp.swapaxes(vx, -1, -2)
    d_s = probs * (d_p - xp.sum(d_p * probs, axis=-1, keepdims=True))
    d_q = (d_s @ kx) * scale
    d_k = (xp.swapaxes(d_s, -1, -2) @ xp.astype(q, acc)) * scale

    def fold(t: Any) -> Any:  # sum the query heads sharing a kv head
        return xp.sum(t.reshape(batch, heads_kv, group, seq_kv, dim), axis=2)

    return xp.astype(d_q, q.dtype), xp.astype(fold(d_k), k.dtype), xp.astype(fold(d_v), v.dtype)


# --- add_rms_norm -------------------------------------------------------------------------


def add_rms_norm_fwd(x: Any, residual: Any, weight: Any, eps: float) -> tuple[Any, Any, Any]:
    """(y, s, rstd): s = x + residual (in x's dtype), y = rms_norm(s) of s as stored."""
    xp, ct = _xp(x), compute_dtype(x)
    s = xp.astype(xp.astype(x, ct) + xp.astype(residual, ct), x.dtype)
    y, rstd = rms_norm_fwd(s, weight, eps)
    return y, s, rstd


def add_rms_norm_bwd(dy: Any, ds: Any, s: Any, weight: Any, rstd: Any) -> tuple[Any, Any]:
    """(dx, dweight): dx = rms_norm_bwd(dy) + ds, also the residual's gradient."""
    xp, ct = _xp(s), compute_dtype(s)
    dx, dw = rms_norm_bwd(dy, s, weight, rstd)
    return xp.astype(xp.astype(dx, ct) + xp.astype(ds, ct), s.dtype), dw


# --- swiglu / geglu -----------------------------------------------------------------------

GLU_ACTIVATIONS = ("silu", "gelu_tanh")


def _act_and_grad(g: Any, activation: str) -> tuple[Any, Any]:
    xp = _xp(g)
    if activation == "silu":
        sig = xp.sigmoid(g)
        return g * sig, sig * (1 + g * (1 - sig))
    k = math.sqrt(2 / math.pi)
    t = xp.tanh(k * (g + 0.044715 * g**3))
    return 0.5 * g * (1 + t), 0.5 * (1 + t) + 0.5 * g * (1 - t * t) * k * (1 + 3 * 0.044715 * g * g)


def glu(gate: Any, up: Any, activation: str) -> Any:
    """act(gate) * up: activation "silu" (SwiGLU) or "gelu_tanh" (GeGLU)."""
    xp, ct = _xp(gate), compute_dtype(gate)
    act, _ = _act_and_grad(xp.astype(gate, ct), activation)
    return xp.astype(act * xp.astype(up, ct), gate.dtype)


def glu_bwd(dy: Any, gate: Any, up: Any, activation: str) -> tuple[Any, Any]:
    """(dgate, dup) of act(gate) * up."""
    xp, ct = _xp(gate), compute_dtype(gate)
    act, dact = _act_and_grad(xp.astype(gate, ct), activation)
    dyf = xp.astype(dy, ct)
    return xp.astype(dyf * xp.astype(up, ct) * dact, gate.dtype), xp.astype(dyf * act, up.dtype)


# --- linear_cross_entropy -----------------------------------------------------------------


def cross_entropy_rows(logits: Any, target: Any, ignore_index: int) -> tuple[Any, Any]:
    """(loss per row, softmax - onehot per row), fp32 or wider; ignored rows give zeros."""
    xp = _xp(logits)
    lf = xp.astype(logits, acc_dtype(logits.dtype))
    valid = target != ignore_index
    safe = xp.where(valid, target, 0)
    lse = xp.logsumexp(lf, axis=-1)
    picked = xp.take_along_axis(lf, safe[:, None], axis=1)[:, 0]
    loss = xp.where(valid, lse - picked, 0.0)
    onehot = xp.arange(lf.shape[1], safe.dtype, lf)[None, :] == safe[:, None]
    grad = xp.softmax(lf, axis=-1) - xp.astype(onehot, lf.dtype)
    return loss, grad * xp.astype(valid, lf.dtype)[:, None]


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> torch.Tensor:
    """Cross-entropy of ``hidden @ weight.T`` (full logits: the reference, not the fused op)."""
    logits = hidden @ weight.t()
    loss, _ = cross_entropy_rows(logits, target, ignore_index)
    if reduction == "none":
        return loss
    total = loss.sum()
    if reduction == "sum":
        return total
    return total / (target != ignore_index).sum().clamp(min=1)


def linear_cross_entropy_bwd(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    row_scale: torch.Tensor,
    ignore_index: int = -100,
) -> tuple[Any, Any]:
    """(dhidden, dweight) for d loss_i = row_scale_i (per-row upstream gradient)."""
    logits = hidden @ weight.t()
    _, grad = cross_entropy_rows(logits, target, ignore_index)
    dlogits = grad * row_scale.to(grad.dtype)[:, None]
    ct = dlogits.dtype
    dh = (dlogits @ weight.to(ct)).to(hidden.dtype)
    dw = (dlogits.t() @ hidden.to(ct)).to(weight.dtype)
    return dh, dw
