"""greta_core.jax.linear_cross_entropy: cross-entropy of hidden @ weight.T in token chunks
(the schedule of ``greta_core.ops.linear_cross_entropy``), differentiable (custom_vjp).

The forward computes only the loss; the backward redoes each chunk's logits and takes
dlogits from the same Triton kernel (jax-triton) or jax.numpy, with per-row gradients, so
every reduction shares one backward.
"""

from __future__ import annotations

import functools
from typing import Any

from greta_core.errors import GretaInputError
from greta_core.jax._declared import _run_plan, implementation
from greta_core.jax._rows_common import check_float
from greta_core.ops.linear_cross_entropy import (
    LINEAR_CROSS_ENTROPY_BWD,
    OP,
    REDUCTIONS,
    _jax_precision,
    bad_target_message,
    chunks,
    jax_rows,
)  # fmt: skip


def _loss_rows(hidden: Any, weight: Any, target: Any, ignore_index: int) -> Any:
    import jax.numpy as jnp

    n, h = hidden.shape
    out = []
    ones = jnp.ones((n,), jnp.float32)
    prec = _jax_precision(hidden.dtype)
    run = functools.partial(_run_plan, LINEAR_CROSS_ENTROPY_BWD)
    for s, e in chunks(n, weight.shape[0], h):
        logits = jnp.dot(hidden[s:e], weight.T, precision=prec).astype(hidden.dtype)
        out.append(jax_rows(run, logits, target[s:e], ones[s:e], ignore_index, False)[0])
    return jnp.concatenate(out) if out else jnp.zeros((0,), jnp.float32)


def _reduce(rows: Any, target: Any, ignore_index: int, reduction: str) -> tuple[Any, Any]:
    """(loss, n_valid as fp32)."""
    import jax.numpy as jnp

    n_valid = jnp.maximum(jnp.sum(target != ignore_index), 1).astype(jnp.float32)
    if reduction == "none":
        return rows, n_valid
    total = jnp.sum(rows)
    return (total if reduction == "sum" else total / n_valid), n_valid


@functools.cache
def _build(ignore_index: int, reduction: str) -> Any:
    import jax
    import jax.numpy as jnp

    @jax.custom_vjp
    def f(hidden: Any, weight: Any, target: Any) -> Any:
        rows = _loss_rows(hidden, weight, target, ignore_index)
        return _reduce(rows, target, ignore_index, reduction)[0]

    def fwd(hidden: Any, weight: Any, target: Any) -> tuple[Any, Any]:
        rows = _loss_rows(hidden, weight, target, ignore_index)
        loss, n_valid = _reduce(rows, target, ignore_index, reduction)
        return loss, (hidden, weight, target, n_valid)

    def bwd(res: Any, g: Any) -> tuple[Any, Any, Any]:
        hidden, weight, target, n_valid = res
        n = hidden.shape[0]
        if reduction == "none":
            row_scale = g.astype(jnp.float32)
        else:
            row_scale = jnp.full((n,), g, jnp.float32)
            if reduction == "mean":
                row_scale = row_scale / n_valid
        dh, dw = implementation(LINEAR_CROSS_ENTROPY_BWD, hidden, weight, target, row_scale,
                                ignore_index)  # fmt: skip
        return dh, dw, None

    f.defvjp(fwd, bwd)
    return f


def linear_cross_entropy(
    hidden: Any, weight: Any, target: Any, ignore_index: int = -100, reduction: str = "mean"
) -> Any:
    """Cross-entropy of ``hidden @ weight.T`` ([N, H] @ [H, V]) against int `target` [N],
    chunked over tokens; differentiable in hidden and weight. The loss is float32."""
    check_float(OP, "hidden", hidden)
    check_float(OP, "weight", weight)
    if hidden.ndim != 2 or weight.ndim != 2 or weight.shape[1] != hidden.shape[1]:
        raise GretaInputError(
            f"{OP}: arguments 'hidden' {hidden.shape} and 'weight' {weight.shape} must be "
            "[N, H] and [V, H]"
        )
    if weight.dtype != hidden.dtype:
        raise GretaInputError(f"{OP}: 'weight' dtype {weight.dtype} differs from 'hidden's")
    if target.shape != (hidden.shape[0],) or "int" not in str(target.dtype):
        raise GretaInputError(
            f"{OP}: argument 'target' must be an int array of shape ({hidden.shape[0]},), "
            f"got {target.shape} {target.dtype}"
        )
    if reduction not in REDUCTIONS:
        raise GretaInputError(f"{OP}: reduction {reduction!r} not in {', '.join(REDUCTIONS)}")
    _check_targets(target, int(weight.shape[0]), int(ignore_index))
    return _build(int(ignore_index), reduction)(hidden, weight, target)


def _check_targets(target: Any, vocab: int, ignore_index: int) -> None:
    """As the torch binding: a class outside [0, vocab) that is not ignore_index is refused
    (values under jax.jit are abstract: not checked there)."""
    import jax
    import numpy as np

    if isinstance(target, jax.core.Tracer) or target.size == 0:
        return
    values = np.asarray(target)
    bad = ((values < 0) | (values >= vocab)) & (values != ignore_index)
    if bad.any():
        raise GretaInputError(bad_target_message(int(values[bad][0]), vocab, ignore_index))
