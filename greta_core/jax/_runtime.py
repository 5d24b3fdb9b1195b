"""When the Triton path is usable under JAX, and for which arch."""

from __future__ import annotations

import functools
import inspect
import logging
import os
from collections.abc import Callable, MutableMapping
from typing import Any

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

        _adapt_jax_triton_dce_rule()
    except Exception as exc:  # ImportError, or its GPU-support check failing
        return False, f"jax-triton unavailable: {exc}".splitlines()[0]
    finally:
        # jax-triton blanks TRITON_CACHE_DIR on import; an empty value makes every later
        # Triton compile in this process (torch path included) fail to find a cache dir.
        if os.environ.get("TRITON_CACHE_DIR") == "":
            del os.environ["TRITON_CACHE_DIR"]
    return True, "jax-triton on " + jax.default_backend()


def _arity(fn: Callable[..., Any]) -> int:
    return len(inspect.signature(fn).parameters)


def adapt_dce_rule(
    rules: MutableMapping[Any, Callable[..., Any]], prim: Any, default_rule: Callable[..., Any]
) -> bool:
    """Make `prim`'s DCE rule take the arguments this jax passes; True if it was replaced.

    jax-triton 0.4.1 (the newest release) registers ``rule(used_outs, eqn)``; jax 0.12 calls
    every DCE rule as ``rule(used_outs, live_ins, eqn)``, so each jax-triton call raised
    TypeError at trace time. The rule it registers keeps every input and the equation (a
    kernel call is never dead code), which the replacement keeps too.
    """
    rule = rules.get(prim)
    if rule is None or _arity(rule) == _arity(default_rule):
        return False

    def keep_everything(used_outs: list[bool], *rest: Any) -> tuple[list[bool], Any]:
        eqn = rest[-1]
        return [True] * len(eqn.invars), eqn

    rules[prim] = keep_everything
    return True


def _adapt_jax_triton_dce_rule() -> None:
    try:  # private names: where they move, the calls themselves say what broke
        from jax._src.interpreters import partial_eval as pe
        from jax_triton import triton_lib

        adapted = adapt_dce_rule(
            pe.dce_rules, triton_lib.triton_kernel_call_p, pe._default_dce_rule
        )
    except (ImportError, AttributeError, ValueError, TypeError) as exc:
        logger.debug("greta: jax-triton's DCE rule left as it is: %s", exc)
        return
    if adapted:
        logger.debug("greta: jax-triton's DCE rule adapted to this jax's calling convention")


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
