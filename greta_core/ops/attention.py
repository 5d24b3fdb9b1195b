from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from greta_core import configs
from greta_core.kernels.attention import attention_fwd_kernel, features, grid
from greta_core.observe import record
from greta_core.ops import _interp_compat
from greta_core.ops._validate import GretaInputError, check_same_device, check_tensor, launch_arch

Wrap = Callable[[Any], Any]

HEAD_DIMS: tuple[int, ...] = (64, 128)


def _identity(kernel: Any) -> Any:
    return kernel


def check_shapes(
    q: Any,
    k: Any,
    v: Any,
    q_lens: Any | None = None,
    kv_lens: Any | None = None,
    *,
    dtypes: tuple[Any, ...] | None = None,
) -> None:
    """Shape/dtype rules shared by the Triton path and the torch reference."""
    import torch

    check_tensor("attention", "q", q, dtypes=dtypes, ndim=4)
    check_tensor("attention", "k", k, dtypes=(q.dtype,), ndim=4)
    check_tensor("attention", "v", v, dtypes=(q.dtype,), ndim=4)
    batch, heads_q, _, dim = q.shape
    if k.shape[0] != batch or k.shape[3] != dim:
        raise GretaInputError(
            f"attention: argument 'k' has shape {tuple(k.shape)}; expected [B={batch}, Hkv, "
            f"Skv, D={dim}] to go with q {tuple(q.shape)}"
        )
    if tuple(v.shape) != tuple(k.shape):
        raise GretaInputError(
            f"attention: argument 'v' has shape {tuple(v.shape)}; expected k's {tuple(k.shape)}"
        )
    heads_kv = k.shape[1]
    if heads_kv == 0 or heads_q % heads_kv != 0:
        raise GretaInputError(
            f"attention: argument 'k' has {heads_kv} heads; q's {heads_q} heads must be a "
            "multiple of it (grouped-query attention)"
        )
    for name, lens in (("q_lens", q_lens), ("kv_lens", kv_lens)):
        if lens is None:
            continue
        check_tensor("attention", name, lens, dtypes=(torch.int32,), ndim=1)
        if lens.shape[0] != batch:
            raise GretaInputError(
                f"attention: argument '{name}' has shape {tuple(lens.shape)}; expected ({batch},)"
            )
    check_same_device("attention", q=q, k=k, v=v, q_lens=q_lens, kv_lens=kv_lens)


def validate(q: Any, k: Any, v: Any, q_lens: Any | None = None, kv_lens: Any | None = None) -> str:
    """Check the inputs and return the arch to launch on."""
    import torch

    check_shapes(q, k, v, q_lens, kv_lens, dtypes=(torch.float16, torch.bfloat16))
    if q.shape[3] not in HEAD_DIMS:
        raise GretaInputError(
            f"attention: argument 'q' has head dim {q.shape[3]}; the Triton kernel supports "
            f"{', '.join(map(str, HEAD_DIMS))}"
        )
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(3) != 1:
            raise GretaInputError(
                f"attention: argument '{name}' must have a contiguous last (head) dimension"
            )
    for name, lens in (("q_lens", q_lens), ("kv_lens", kv_lens)):
        if lens is not None and not lens.is_contiguous():
            raise GretaInputError(f"attention: argument '{name}' must be contiguous")
    return launch_arch("attention", q)


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)


def launch(
    q: Any,
    k: Any,
    v: Any,
    causal: bool,
    scale: float | None,
    q_lens: Any | None,
    kv_lens: Any | None,
    out: Any,
    lse: Any,
    arch: str,
    wrap: Wrap = _identity,
) -> None:
    """Launch the kernel; `out` is [B, Hq, Sq, D] (last dim contiguous), `lse` [B, Hq, Sq]
    contiguous fp32. `wrap` is `torch.library.wrap_triton` inside a triton_op."""
    batch, heads_q, seq_q, dim = q.shape
    seq_kv = k.shape[2]
    if batch * heads_q * seq_q == 0:
        return
    has_lens = q_lens is not None or kv_lens is not None
    if has_lens:
        import torch

        # One of the two given: the other is the full length of its axis.
        if q_lens is None:
            q_lens = torch.full((batch,), seq_q, dtype=torch.int32, device=q.device)
        if kv_lens is None:
            kv_lens = torch.full((batch,), seq_kv, dtype=torch.int32, device=q.device)
    if arch == "cpu":
        _interp_compat.apply()
    config = configs.lookup("attention", arch, features(dim, seq_q, seq_kv, causal))
    meta = configs.meta_params(config)
    wrap(attention_fwd_kernel)[grid(batch, heads_q, seq_q, meta["BLOCK_M"])](
        q,
        k,
        v,
        q_lens if has_lens else q,  # never read when HAS_LENS is False
        kv_lens if has_lens else q,
        default_scale(dim) if scale is None else float(scale),
        seq_q,
        seq_kv,
        heads_q,
        heads_q // k.shape[1],
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        v.stride(0),
        v.stride(1),
        v.stride(2),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        out,
        lse,
        HEAD_DIM=dim,
        BLOCK_M=meta["BLOCK_M"],
        BLOCK_N=meta["BLOCK_N"],
        CAUSAL=bool(causal),
        HAS_LENS=has_lens,
        UPCAST=arch == "cpu",
        **configs.launch_options(config, arch),
    )
    record("attention", "triton-interpret" if arch == "cpu" else "triton", arch)


def attention_with_lse(
    q: Any,
    k: Any,
    v: Any,
    causal: bool = False,
    scale: float | None = None,
    q_lens: Any | None = None,
    kv_lens: Any | None = None,
) -> tuple[Any, Any]:
    """(o [B, Hq, Sq, D], logsumexp [B, Hq, Sq] fp32 in natural log)."""
    import torch

    arch = validate(q, k, v, q_lens, kv_lens)
    batch, heads_q, seq_q, dim = q.shape
    out = torch.empty((batch, heads_q, seq_q, dim), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, heads_q, seq_q), dtype=torch.float32, device=q.device)
    launch(q, k, v, causal, scale, q_lens, kv_lens, out, lse, arch)
    return out, lse


def attention(
    q: Any,
    k: Any,
    v: Any,
    causal: bool = False,
    scale: float | None = None,
    q_lens: Any | None = None,
    kv_lens: Any | None = None,
) -> Any:
    """softmax(q k^T * scale) v over [B, H, S, D] tensors (GQA: Hq a multiple of Hkv).

    ``q_lens``/``kv_lens`` (int32 [B]) give per-batch valid lengths: query row i < q_len
    sits at position kv_len - q_len + i and sees keys j < kv_len (j <= position if
    causal); rows i >= q_len come back as zeros.
    """
    return attention_with_lse(q, k, v, causal, scale, q_lens, kv_lens)[0]
