"""attention: q [B,Hq,Sq,D], k/v [B,Hkv,Skv,D] (GQA), bottom-right causal.

Query row i sits at absolute position kv_len - q_len + i; rows at or past q_len are zeros.
Vendor paths are PyTorch SDPA pinned to one backend with ``sdpa_kernel``: flash
(FlashAttention-2 on CUDA, AOTriton or CK on ROCm), cuDNN, memory-efficient, math.
"""

from __future__ import annotations

import functools
from typing import Any

from greta_core.compute import _probes as p
from greta_core.compute.registry import Impl, add, define


def _info(
    q: Any, k: Any, v: Any, causal: bool = True, scale: float | None = None,
    q_lens: Any = None, kv_lens: Any = None,
) -> p.CallInfo:  # fmt: skip
    return p.info_of(q, k, v, extra=(bool(causal), q_lens is not None, kv_lens is not None))


def needs_mask(sq: int, skv: int, causal: bool, has_q_lens: bool, has_kv_lens: bool) -> bool:
    """SDPA's is_causal is top-left aligned: anything but the plain cases needs a mask."""
    if has_q_lens or has_kv_lens:
        return True
    return causal and sq != skv and sq != 1


def masks(
    b: int, sq: int, skv: int, causal: bool, q_lens: Any, kv_lens: Any, device: Any
) -> tuple[Any, Any]:
    """(allowed [B,1,Sq,Skv] bool, row_valid [B,1,Sq,1] bool), all as device tensors."""
    import torch

    i = torch.arange(sq, device=device)[None, :, None]
    j = torch.arange(skv, device=device)[None, None, :]
    kv_len = (
        kv_lens.to(torch.long)[:, None, None]
        if kv_lens is not None
        else torch.full((b, 1, 1), skv, device=device, dtype=torch.long)
    )
    q_len = (
        q_lens.to(torch.long)[:, None, None]
        if q_lens is not None
        else torch.full((b, 1, 1), sq, device=device, dtype=torch.long)
    )
    allowed = j < kv_len
    if causal:
        allowed = allowed & (j <= kv_len - q_len + i)
    row_valid = (i < q_len) & allowed.any(-1, keepdim=True)
    return allowed[:, None], row_valid[:, None]


def _reference(
    q: Any, k: Any, v: Any, causal: bool = True, scale: float | None = None,
    q_lens: Any = None, kv_lens: Any = None,
) -> Any:  # fmt: skip
    from greta_core import reference

    return reference.attention(q, k, v, causal, scale, q_lens, kv_lens)


def _head_dim_reason(info: p.CallInfo) -> str | None:
    from greta_core.ops.attention import HEAD_DIMS

    d = info.shapes[0][3]
    if d not in HEAD_DIMS:
        return (
            f"the GRETA attention kernel takes head dim {'/'.join(map(str, HEAD_DIMS))} (got {d})"
        )
    return None


def _greta(
    q: Any, k: Any, v: Any, causal: bool = True, scale: float | None = None,
    q_lens: Any = None, kv_lens: Any = None,
) -> Any:  # fmt: skip
    import torch

    if p.eager_raw(q, k, v, q_lens, kv_lens):
        from greta_core.ops.attention import attention

        return attention(q, k, v, causal, scale, q_lens, kv_lens)
    return p.unwrap(torch.ops.greta.attention(q, k, v, causal, scale, q_lens, kv_lens))


# --- SDPA with one pinned backend -------------------------------------------------------

_BACKENDS = {
    "sdpa-flash": ("FLASH_ATTENTION", "can_use_flash_attention"),
    "sdpa-cudnn": ("CUDNN_ATTENTION", "can_use_cudnn_attention"),
    "sdpa-efficient": ("EFFICIENT_ATTENTION", "can_use_efficient_attention"),
    "sdpa-math": ("MATH", None),
}


@functools.lru_cache(maxsize=256)
def _gqa_mode(name: str, info: p.CallInfo) -> tuple[str | None, bool]:
    """(reason unavailable or None, use enable_gqa) for SDPA backend `name` on this call."""
    import torch

    (b, hq, sq, d), (_, hkv, skv, _), _ = info.shapes
    causal, has_ql, has_kvl = info.extra
    check = _BACKENDS[name][1]
    if check is None:
        return None, hq != hkv
    dtype = getattr(torch, info.dtype)
    with_mask = needs_mask(sq, skv, causal, has_ql, has_kvl)

    def params(heads_kv: int, gqa: bool) -> Any:
        # Stride-0 placeholders with the call's shapes: the checks read sizes/strides only.
        def fake(*shape: int) -> Any:
            return torch.empty(shape[-1], device="cuda", dtype=dtype).expand(*shape)

        mask = (
            torch.empty(skv, device="cuda", dtype=torch.bool).expand(b, 1, sq, skv)
            if with_mask
            else None
        )
        is_causal = causal and not with_mask and sq == skv and sq > 1
        return torch.backends.cuda.SDPAParams(
            fake(b, hq, sq, d), fake(b, heads_kv, skv, d), fake(b, heads_kv, skv, d),
            mask, 0.0, is_causal, gqa,
        )  # fmt: skip

    can_use = getattr(torch.backends.cuda, check)
    if hq != hkv and can_use(params(hkv, True), False):
        return None, True
    if can_use(params(hq, False), False):
        return None, False
    # Ask again with debug on only to collect PyTorch's own reason.
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        can_use(params(hq, False), True)
    detail = "; ".join(str(w.message).strip() for w in caught)[:300]
    return f"PyTorch SDPA refuses this call{': ' + detail if detail else ''}", False


def _sdpa_probe(name: str) -> Any:
    def probe(info: p.CallInfo) -> str | None:
        why = p.needs_gpu(info)
        if why:
            return why
        import torch

        if name == "sdpa-flash" and not torch.backends.cuda.is_flash_attention_available():
            return "this torch build has no flash attention"
        return _gqa_mode(name, info)[0]

    return probe


def _sdpa(name: str) -> Any:
    def run(
        q: Any, k: Any, v: Any, causal: bool = True, scale: float | None = None,
        q_lens: Any = None, kv_lens: Any = None,
    ) -> Any:  # fmt: skip
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        info = _info(q, k, v, causal, scale, q_lens, kv_lens)
        gqa = _gqa_mode(name, info)[1]
        b, hq, sq, _ = q.shape
        hkv, skv = k.shape[1], k.shape[2]
        if hq != hkv and not gqa:
            k = k.repeat_interleave(hq // hkv, dim=1)
            v = v.repeat_interleave(hq // hkv, dim=1)
        mask = row_valid = None
        if needs_mask(sq, skv, causal, q_lens is not None, kv_lens is not None):
            mask, row_valid = masks(b, sq, skv, causal, q_lens, kv_lens, q.device)
        is_causal = causal and mask is None and sq == skv and sq > 1
        with sdpa_kernel(getattr(SDPBackend, _BACKENDS[name][0])):
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=gqa
            )
        if row_valid is not None:
            out = torch.where(row_valid, out, 0.0)
        return out

    return run


OP = define("attention", "scaled dot-product attention, GQA, KV lengths", _info)
add(
    OP,
    Impl(
        "greta",
        "greta",
        _greta,
        lambda i: p.first_reason(
            p.greta_op("attention"),
            # On GPU the Triton kernel takes fp16/bf16; on CPU the torch reference any float.
            p.dtype_in(
                i,
                ("float16", "bfloat16") if i.device == "cuda" else p.HALF_AND_FLOAT,
                "the GRETA attention kernel",
            ),
            _head_dim_reason(i),
        ),
        {"any": "GRETA Triton flash attention"},
    ),
)
_LABELS = {
    "sdpa-flash": {
        "cuda": "FlashAttention-2 (SDPA flash)",
        "rocm": "AOTriton or CK flash (SDPA flash; TORCH_ROCM_FA_PREFER_CK)",
    },
    "sdpa-cudnn": {"cuda": "cuDNN attention (SDPA)", "rocm": "cuDNN attention (none on ROCm)"},
    "sdpa-efficient": {
        "cuda": "memory-efficient attention (SDPA, xFormers-derived)",
        "rocm": "AOTriton memory-efficient attention (SDPA)",
    },
    "sdpa-math": {"any": "SDPA math (framework GEMMs + softmax)"},
}
for _name in _BACKENDS:
    add(
        OP,
        Impl(
            _name,
            "vendor",
            _sdpa(_name),
            _sdpa_probe(_name),
            {**_LABELS[_name], "any": _LABELS[_name].get("any", _name)},
        ),
    )
add(
    OP,
    Impl(
        "reference",
        "reference",
        _reference,
        lambda i: p.dtype_in(i, p.FLOATS, "the reference"),
        {"any": "plain torch math, float32/float64"},
    ),
)
