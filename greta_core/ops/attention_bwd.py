"""Attention backward launcher: (dq, dk, dv) from (do, q, k, v, o, lse) with the Triton kernels.

No per-batch lengths (q_lens/kv_lens): those calls keep the reference backward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import triton

from greta_core.arch import is_hip
from greta_core.kernels.attention_bwd import attention_bwd_dkdv_kernel, attention_bwd_dq_kernel
from greta_core.observe import record
from greta_core.ops import _interp_compat
from greta_core.ops._validate import GretaInputError, check_tensor
from greta_core.ops.attention import default_scale, validate

Wrap = Callable[[Any], Any]
OP = "attention_bwd"


def _identity(kernel: Any) -> Any:
    return kernel


# Per kernel: dkdv walks query blocks for a block of keys, dq walks key blocks for a block
# of queries. Keyed by head dim; tuned on the H100 with bench/tune_attention_bwd.py (bf16,
# causal; bench/results/h100/tune_attention_bwd.json): 4 warps beat 8 at head dim 128 for
# both kernels (3.31 -> ~2.3 ms for the pair at B4 H32/8 S2048), and 32-row query blocks
# help dkdv at head dim 64. `launch(configs=...)` overrides them.
_CUDA: dict[int, tuple[dict[str, int], dict[str, int]]] = {
    64: (
        {"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2},
        {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2},
    ),
    128: (
        {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2},
        {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2},
    ),
}


def kernel_configs(arch: str, head_dim: int) -> tuple[dict[str, int], dict[str, int]]:
    """(dkdv config, dq config): block sizes + num_warps/num_stages for this arch."""
    dkdv, dq = _CUDA[128 if head_dim > 64 else 64]
    if arch == "cpu" or is_hip(arch):
        # Untimed on AMD: FlashAttention-2's 64x64 tiles, one stage (AMD's guidance for
        # MI300X Triton kernels is num_stages <= 2; the interpreter ignores both).
        warps = 4 if head_dim <= 64 else 8
        base = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": warps, "num_stages": 1}
        return dict(base), dict(base)
    return dict(dkdv), dict(dq)


def split_config(config: dict[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    """(block-size constexprs, launch options) of a kernel config."""
    blocks = {k: v for k, v in config.items() if k.startswith("BLOCK_")}
    return blocks, {k: v for k, v in config.items() if not k.startswith("BLOCK_")}


def validate_bwd(do: Any, q: Any, k: Any, v: Any, o: Any, lse: Any) -> str:
    import torch

    arch = validate(q, k, v)
    for name, t in (("do", do), ("o", o)):
        check_tensor(OP, name, t, dtypes=(q.dtype,), ndim=4)
        if tuple(t.shape) != tuple(q.shape) or t.stride(3) != 1:
            raise GretaInputError(
                f"{OP}: argument '{name}' must be shaped like q {tuple(q.shape)} with a "
                f"contiguous last dim (got {tuple(t.shape)})"
            )
    check_tensor(OP, "lse", lse, dtypes=(torch.float32,), ndim=3, contiguous=True)
    if tuple(lse.shape) != tuple(q.shape[:3]):
        raise GretaInputError(
            f"{OP}: argument 'lse' has shape {tuple(lse.shape)}; expected {tuple(q.shape[:3])}"
        )
    return arch


def launch(
    do: Any, q: Any, k: Any, v: Any, lse: Any, delta: Any, causal: bool, scale: float | None,
    dq: Any, dk_heads: Any, dv_heads: Any, arch: str, wrap: Wrap = _identity,
    configs: tuple[dict[str, int], dict[str, int]] | None = None,
) -> None:  # fmt: skip
    """dq [B, Hq, Sq, D], dk_heads/dv_heads [B, Hq, Skv, D]: fp32, contiguous.
    `configs`: (dkdv, dq) overrides of `kernel_configs` (tuning)."""
    batch, heads_q, seq_q, dim = q.shape
    seq_kv = k.shape[2]
    if batch * heads_q * seq_q * seq_kv == 0:
        return
    if arch == "cpu":
        _interp_compat.apply()
    dkdv_cfg, dq_cfg = configs or kernel_configs(arch, dim)
    args = (
        q, k, v, do, lse, delta,
        default_scale(dim) if scale is None else float(scale),
        seq_q, seq_kv, heads_q, heads_q // k.shape[1],
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3],
    )  # fmt: skip
    common = {"HEAD_DIM": dim, "CAUSAL": bool(causal), "UPCAST": arch == "cpu"}
    grid_bh = batch * heads_q
    # A config is block-size constexprs + num_warps/num_stages: all launch keywords.
    wrap(attention_bwd_dkdv_kernel)[(triton.cdiv(seq_kv, dkdv_cfg["BLOCK_N"]), grid_bh)](
        *args, dk_heads, dv_heads, **common, **dkdv_cfg
    )
    wrap(attention_bwd_dq_kernel)[(triton.cdiv(seq_q, dq_cfg["BLOCK_M"]), grid_bh)](
        *args, dq, **common, **dq_cfg
    )
    record(OP, "triton-interpret" if arch == "cpu" else "triton", arch)


def attention_bwd(
    do: Any, q: Any, k: Any, v: Any, o: Any, lse: Any, causal: bool = False,
    scale: float | None = None, wrap: Wrap = _identity,
) -> tuple[Any, Any, Any]:  # fmt: skip
    """Gradients of ``attention(q, k, v, causal, scale)`` given its output ``o``, its
    logsumexp ``lse`` (``attention_with_lse``) and ``do`` = dL/do: (dq, dk, dv) in q's dtype;
    dk/dv summed over each group of query heads sharing a KV head. `wrap` is
    `torch.library.wrap_triton` inside a triton_op."""
    import torch

    arch = validate_bwd(do, q, k, v, o, lse)
    batch, heads_q, seq_q, dim = q.shape
    heads_kv, seq_kv = k.shape[1], k.shape[2]
    delta = (o.float() * do.float()).sum(-1).contiguous()
    # Zeros: an empty sequence launches nothing and must still give zero gradients.
    dq = torch.zeros((batch, heads_q, seq_q, dim), dtype=torch.float32, device=q.device)
    dk = torch.zeros((batch, heads_q, seq_kv, dim), dtype=torch.float32, device=q.device)
    dv = torch.zeros_like(dk)
    launch(do, q, k, v, lse, delta, causal, scale, dq, dk, dv, arch, wrap=wrap)
    group = heads_q // heads_kv
    dk = dk.view(batch, heads_kv, group, seq_kv, dim).sum(2)
    dv = dv.view(batch, heads_kv, group, seq_kv, dim).sum(2)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
