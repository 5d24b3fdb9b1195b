"""``apply_rotary_pos_emb`` through ``torch.ops.greta.rope``.

Transformers hands q and k as [batch, heads, seq, head_dim] (``unsqueeze_dim=1``) and cos /
sin as [batch, seq, head_dim] with both halves equal (``cat(freqs, freqs)``). GRETA's rope
takes [batch, seq, heads, head_dim] with any strides and the half tables, so both
conversions are views: no copy.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from greta_core.torch._declared import ops as greta_ops
from greta_core.transformers._fallback import fall_back


def make_apply_rotary_pos_emb(original: Callable) -> Callable:
    def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
        reason = _unsupported(q, k, cos, sin, unsqueeze_dim)
        if reason:
            fall_back("rope", "transformers", reason)
            return original(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
        half = cos.shape[-1] // 2
        c, s = cos[..., :half], sin[..., :half]
        if unsqueeze_dim == 1:
            q_rot = greta_ops.rope(q.transpose(1, 2), c, s).transpose(1, 2)
            k_rot = greta_ops.rope(k.transpose(1, 2), c, s).transpose(1, 2)
        else:
            q_rot, k_rot = greta_ops.rope(q, c, s), greta_ops.rope(k, c, s)
        return q_rot, k_rot

    apply_rotary_pos_emb.__greta_original__ = original  # type: ignore[attr-defined]
    return apply_rotary_pos_emb


def _unsupported(q, k, cos, sin, unsqueeze_dim) -> str:
    if unsqueeze_dim not in (1, 2) or q.dim() != 4 or k.dim() != 4 or cos.dim() != 3:
        return "layout other than [batch, heads, seq, head_dim] / [batch, seq, heads, head_dim]"
    if cos.shape[-1] != q.shape[-1] or cos.shape[-1] % 2:
        return "partial rotary embedding (rotary dim != head dim)"
    if k.dtype != q.dtype or sin.dtype != cos.dtype or cos.dtype not in (q.dtype, torch.float32):
        return "cos/sin dtype is neither q's nor float32"
    return ""
