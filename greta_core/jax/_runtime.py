"""When the Triton path is usable under JAX, and for which arch."""

from __future__ import annotations

import functools
import logging
import os

from greta_core.arch import normalize_arch

logger = logging.getLogger("greta")


@functools.lru_cache(maxsize=1)
def jax_triton_status() -> tuple[bool, str]:
    """(usable, reason). jax-triton refuses to import without a GPU build of jaxlib."""
    import jax

    if jax.default_backend() not in ("gpu", "cuda", "rocm"):
        return False, f"jax backend is {jax.default_backend()!r}, not a GPU"
    try:
        import jax_triton  # noqa: F401
    except Exception as exc:  # ImportError, or its GPU-support check failing
        return False, f"jax-triton unavailable: {exc}".splitlines()[0]
    finally:
        # jax-triton blanks TRITON_CACHE_DIR on import; an empty value makes every later
        # Triton compile in this process (torch path included) fail to find a cache dir.
        if os.environ.get("TRITON_CACHE_DIR") == "":
            del os.environ["TRITON_CACHE_DIR"]
    return True, "jax-triton on " + jax.default_backend()


def use_triton() -> bool:
    ok, why = jax_triton_status()
    if not ok:
        logger.debug("greta: jax ops use the jax.numpy reference: %s", why)
    return ok


@functools.lru_cache(maxsize=1)
def jax_arch() -> str:
    """Arch of JAX's first GPU ("sm_90", "gfx942")."""
    import jax

    device = jax.devices()[0]
    cc = getattr(device, "compute_capability", None)
    if cc:
        return normalize_arch(str(cc))
    kind = str(getattr(device, "device_kind", ""))
    if "gfx" in kind:
        return normalize_arch(kind[kind.index("gfx") :].split()[0])
    return "default"
