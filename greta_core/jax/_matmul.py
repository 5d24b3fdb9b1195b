from __future__ import annotations

from typing import Any

from greta_core.jax._runtime import jax_arch, use_triton
from greta_core.observe import record


def _check(a: Any, b: Any, bias: Any | None) -> None:
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(
            f"matmul: arguments 'a' {a.shape} and 'b' {b.shape} must be 2-D with "
            "a.shape[1] == b.shape[0]"
        )
    if a.dtype != b.dtype:
        raise ValueError(f"matmul: argument 'b' has dtype {b.dtype}; expected a's {a.dtype}")
    if bias is not None and (bias.shape != (b.shape[1],) or bias.dtype != a.dtype):
        raise ValueError(
            f"matmul: argument 'bias' {bias.shape} {bias.dtype} must be ({b.shape[1]},) {a.dtype}"
        )


def _reference(a: Any, b: Any, bias: Any | None) -> Any:
    import jax.numpy as jnp

    acc = jnp.promote_types(a.dtype, jnp.float32)
    out = jnp.matmul(a, b, preferred_element_type=acc)
    if bias is not None:
        out = out + bias.astype(acc)
    return out.astype(a.dtype)


def _triton(a: Any, b: Any, bias: Any | None) -> Any:
    import jax
    import jax_triton as jt

    from greta_core import configs
    from greta_core.kernels.matmul import features, grid, matmul_kernel

    arch = jax_arch()
    m, k = a.shape
    n = b.shape[1]
    config = configs.lookup("matmul", arch, features(m, n, k))
    meta = configs.meta_params(config)
    record("matmul", "jax-triton", arch)
    return jt.triton_call(
        a,
        b,
        bias if bias is not None else a,  # never read when HAS_BIAS is False
        m,
        n,
        k,
        k,  # row-major JAX arrays: stride_am, stride_ak, stride_bk, stride_bn, stride_cm, ...
        1,
        n,
        1,
        n,
        1,
        kernel=matmul_kernel,
        out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
        grid=grid(m, n, meta["BLOCK_M"], meta["BLOCK_N"]),
        num_warps=config.get("num_warps", 4),
        num_stages=config.get("num_stages", 3),
        BLOCK_M=meta["BLOCK_M"],
        BLOCK_N=meta["BLOCK_N"],
        BLOCK_K=meta["BLOCK_K"],
        GROUP_M=meta["GROUP_M"],
        HAS_BIAS=bias is not None,
        EVEN_K=k % meta["BLOCK_K"] == 0,
        INT64=max(m * k, k * n, m * n) >= 2**31,
        UPCAST=False,
    )


def _forward(a: Any, b: Any, bias: Any | None) -> Any:
    import jax.numpy as jnp

    triton_dtypes = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))
    if use_triton() and jnp.dtype(a.dtype) in triton_dtypes and 0 not in (*a.shape, b.shape[1]):
        return _triton(a, b, bias)
    record("matmul", "reference-jnp")
    return _reference(a, b, bias)


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
