"""greta::attention, greta::attention_fwd -> (o, logsumexp) and greta::attention_bwd,
derived from their declarations (ops/attention.py, ops/attention_bwd.py), plus
greta::attention_with_lse: greta::attention_fwd in the public argument order."""

from __future__ import annotations

from typing import Any

import torch

from greta_core import reference as ref
from greta_core.ops import attention as raw
from greta_core.ops.attention import ATTENTION
from greta_core.ops.attention_bwd import ATTENTION_BWD
from greta_core.torch._declared import register

attention_bwd = register(ATTENTION_BWD)
attention_fwd = register(ATTENTION)


def reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
    scale: float | None = None, q_lens: torch.Tensor | None = None,
    kv_lens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(o in q's dtype, logsumexp fp32 or wider): the kernel's semantics in torch ops."""
    raw.check_shapes(q, k, v, q_lens, kv_lens)
    return ref.attention_with_lse(q, k, v, causal, scale, q_lens, kv_lens)


_lib = torch.library.Library("greta", "FRAGMENT")
_lib.define(
    f"attention_with_lse({ATTENTION.schema.partition('->')[0].strip()}) -> (Tensor, Tensor)"
)


def _attention_with_lse(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.ops.greta.attention_fwd(*ATTENTION.bind(args, kwargs))


# CompositeImplicitAutograd: decomposes into greta::attention_fwd (autograd, compile, fake).
_lib.impl("attention_with_lse", _attention_with_lse, "CompositeImplicitAutograd")
