"""greta_core.jax.linear_cross_entropy: cross-entropy of hidden @ weight.T in token chunks,
differentiable in hidden and weight: the JAX binding of the declared
greta::linear_cross_entropy_fwd (ops/linear_cross_entropy.py). Its forward computes only
the loss; the backward redoes each chunk's logits through the declared backward op, with
per-row gradients, so every reduction shares one backward.
"""

from __future__ import annotations

from typing import Any

from greta_core.jax._declared import bind
from greta_core.ops.linear_cross_entropy import LINEAR_CROSS_ENTROPY_FWD

_forward = bind(LINEAR_CROSS_ENTROPY_FWD)


def linear_cross_entropy(
    hidden: Any, weight: Any, target: Any, ignore_index: int = -100, reduction: str = "mean"
) -> Any:
    """Cross-entropy of ``hidden @ weight.T`` ([N, H] @ [H, V]) against int `target` [N],
    chunked over tokens; differentiable in hidden and weight. The loss is float32."""
    return _forward(hidden, weight, target, ignore_index, reduction, False)[0]
