from __future__ import annotations

from typing import Any

from greta_core import reference
from greta_core.errors import GretaInputError
from greta_core.jax._rows_common import check_float
from greta_core.jax._runtime import jax_arch, use_triton
from greta_core.observe import record


def _check(a: Any, b: Any, bias: Any | None) -> None:
    """Raises GretaInputError unless a [M, K] @ b [K, N] (+ bias [N]) share a float dtype."""
    check_float("matmul", "a", a)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise GretaInputError(
            f"matmul: arguments 'a' {a.shape} and 'b' {b.shape} must be 2-D with "
            "a.shape[1] == b.shape[0]"
        )
    if a.dtype != b.dtype:
        raise GretaInputError(f"matmul: argument 'b' has dtype {b.dtype}; expected a's {a.dtype}")
    if bias is not None and (bias.shape != (b.shape[1],) or bias.dtype != a.dtype):
        raise GretaInputError(
            f"matmul: argument 'bias' {bias.shape} {bias.dtype} must be ({b.shape[1]},) {a.dtype}"
        )


def _triton(a: Any, b: Any, bias: Any | None) -> Any:
    from greta_core.jax._plan import run
    from greta_core.ops.matmul import plan

    m, k = a.shape
    n = b.shape[1]
    # Row-major JAX arrays.
    p = plan(m, n, k, (k, 1), (n, 1), (n, 1), str(a.dtype), bias is not None, jax_arch())
    return run(p, (a, b) if bias is None else (a, b, bias))[0]


def _forward(a: Any, b: Any, bias: Any | None) -> Any:
    import jax.numpy as jnp

    triton_dtypes = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))
    # K = 0 (an empty sum) takes the reference: no zero-size buffers through jax-triton.
    if use_triton() and jnp.dtype(a.dtype) in triton_dtypes and a.shape[1] > 0:
        return _triton(a, b, bias)
    record("matmul", "reference-jnp")
    return reference.matmul(a, b, bias)


def _make() -> tuple[Any, Any]:
    import jax
    import jax.numpy as jnp

    @jax.custom_vjp
    def mm(a: Any, b: Any) -> Any:
        return _forward(a, b, None)

    def mm_fwd(a: Any, b: Any) -> tuple[Any, Any]:
        return _forward(a, b, None), (a, b)

    def mm_bwd(res: Any, g: Any) -> tuple[Any, Any]:
        a, b = res
        return _forward(g, b.T, None), _forward(a.T, g, None)

    mm.defvjp(mm_fwd, mm_bwd)

    @jax.custom_vjp
    def mm_bias(a: Any, b: Any, bias: Any) -> Any:
        return _forward(a, b, bias)

    def mm_bias_fwd(a: Any, b: Any, bias: Any) -> tuple[Any, Any]:
        return _forward(a, b, bias), (a, b)

    def mm_bias_bwd(res: Any, g: Any) -> tuple[Any, Any, Any]:
        a, b = res
        acc = jnp.promote_types(g.dtype, jnp.float32)
        grad_bias = g.astype(acc).sum(0).astype(g.dtype)
        return _forward(g, b.T, None), _forward(a.T, g, None), grad_bias

    mm_bias.defvjp(mm_bias_fwd, mm_bias_bwd)
    return mm, mm_bias


_fns: tuple[Any, Any] | None = None


def matmul(a: Any, b: Any, bias: Any | None = None) -> Any:
    """a @ b (+ bias) through the GRETA Triton kernel (GPU) or jax.numpy; differentiable
    (the backward is two more GEMMs through the same path)."""
    global _fns
    _check(a, b, bias)
    if _fns is None:
        _fns = _make()
    mm, mm_bias = _fns
    return mm(a, b) if bias is None else mm_bias(a, b, bias)
