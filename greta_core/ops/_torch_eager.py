"""PyTorch's own eager ops that declared ops hand small training calls to (``OpDecl.
training_route``): where the arch's ``<op>_training`` table entry says backend "torch" for
a call's size, its forward and backward run as torch's C++ autograd runs them, which costs
less host time than any Python ``torch.autograd.Function`` (issue 25: a norm's forward +
backward took 1.5-1.7x F.rms_norm's host time through GRETA's, H200; at small sizes both
kernels take a few microseconds of GPU time). The shipped tables do so up to 8 Mi elements
(``bench/route_bound.py``). Each returns None where torch's op does not take the call as
GRETA's kernels would (a dtype mix), and GRETA's path runs it.

torch is imported on first call: the declarations stay importable without it (JAX)."""

from __future__ import annotations

import functools
from typing import Any


@functools.cache
def fused_rms_norm() -> bool:
    """torch's F.rms_norm is one fused op with its own backward (torch 2.8+); before, it
    decomposes into half a dozen ops, no cheaper on the host than GRETA's path."""
    import torch

    return hasattr(torch.ops.aten, "_fused_rms_norm")


def rms_norm(x: Any, weight: Any, eps: float) -> Any:
    import torch

    if weight.dtype != x.dtype or not fused_rms_norm():
        return None
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)


def layer_norm(x: Any, weight: Any, bias: Any | None, eps: float) -> Any:
    import torch

    if weight.dtype != x.dtype:
        return None
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def softmax(x: Any) -> Any:
    import torch

    return torch.softmax(x, -1)
