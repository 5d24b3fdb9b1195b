from __future__ import annotations

from typing import Any

from greta_core.errors import GretaInputError
from greta_core.jax._rows_common import FLOAT_DTYPES, check_float
from greta_core.observe import record

OP = "kv_cache_append"


def _check(k_cache: Any, v_cache: Any, k: Any, v: Any, cache_lens: Any) -> None:
    for name, a in (("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v)):
        check_float(OP, name, a)
        if a.ndim != 4:
            raise GretaInputError(f"{OP}: argument '{name}' has shape {a.shape}; expected 4 dims")
        if a.dtype != k_cache.dtype:
            raise GretaInputError(
                f"{OP}: argument '{name}' has dtype {a.dtype}; expected {k_cache.dtype}"
            )
    batch, heads, _, d = k_cache.shape
    if v_cache.shape != k_cache.shape:
        raise GretaInputError(
            f"{OP}: argument 'v_cache' has shape {v_cache.shape}; expected {k_cache.shape}"
        )
    for name, a in (("k", k), ("v", v)):
        if (a.shape[0], a.shape[1], a.shape[3]) != (batch, heads, d) or a.shape != k.shape:
            raise GretaInputError(
                f"{OP}: argument '{name}' has shape {a.shape}; expected ({batch}, {heads}, new_tokens, {d})"
            )
    if str(getattr(cache_lens, "dtype", "")) != "int32" or cache_lens.shape != (batch,):
        raise GretaInputError(
            f"{OP}: argument 'cache_lens' must be int32 [{batch}], got "
            f"{getattr(cache_lens, 'dtype', None)} {getattr(cache_lens, 'shape', None)}"
        )


def kv_cache_append(
    k_cache: Any, v_cache: Any, k: Any, v: Any, cache_lens: Any
) -> tuple[Any, Any, Any]:
    """(k_cache, v_cache, new_lens) with k/v written at cache_lens[b] + t.

    On the GPU the caches are updated in place through input_output_aliases (donate them
    under jit to avoid a copy). Tokens past max_seq are dropped; when cache_lens is concrete
    (not traced) an overflow raises GretaInputError instead.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np

    _check(k_cache, v_cache, k, v, cache_lens)
    batch, heads, max_seq, d = k_cache.shape
    n_new = k.shape[2]
    if not isinstance(cache_lens, jax.core.Tracer) and batch > 0:
        from greta_core.ops.kv_cache import check_lengths

        lens = np.asarray(cache_lens)
        check_lengths(int(lens.min()), int(lens.max()), n_new, max_seq)
    from greta_core.jax._runtime import use_triton

    # No new tokens: the reference (no zero-size buffers through jax-triton).
    if str(k_cache.dtype) in FLOAT_DTYPES and n_new > 0 and use_triton():
        from greta_core.jax._plan import run
        from greta_core.jax._runtime import jax_arch
        from greta_core.ops.kv_cache import plan

        ks = (heads * n_new * d, n_new * d, d)
        cs = (heads * max_seq * d, max_seq * d, d)
        p = plan(k_cache.shape, n_new, (ks, ks, cs, cs), str(k_cache.dtype), jax_arch())
        return run(p, (k_cache, v_cache, k, v, cache_lens))
    record(OP, "reference-jnp")
    pos = cache_lens[:, None] + jnp.arange(n_new, dtype=cache_lens.dtype)  # [B, T]
    b_idx = jnp.arange(batch)[:, None, None]
    h_idx = jnp.arange(heads)[None, :, None]
    p_idx = pos[:, None, :]
    # mode="drop": positions past max_seq are skipped, like the kernel's guard.
    k_cache = k_cache.at[b_idx, h_idx, p_idx].set(k, mode="drop")
    v_cache = v_cache.at[b_idx, h_idx, p_idx].set(v, mode="drop")
    return k_cache, v_cache, cache_lens + n_new
