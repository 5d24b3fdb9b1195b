"""Prototype: GRETA's vec_add from JAX, as a custom call through jax-triton, under jax.jit.

    python compat/jax/jax_custom_call_hello.py

On a GPU with jax-triton, greta_core.jax.vec_add lowers to a Triton custom call inside the
jitted function. Without a GPU jaxlib or without jax-triton it runs the jax.numpy
reference instead; the script says why.

Last line: STATUS=OK (the Triton custom call ran and matched), STATUS=FALLBACK reason=...
(the jnp reference ran and matched), or STATUS=FAIL reason=... (exit code 1).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def finish(status: str, reason: str = "") -> int:
    print(f"STATUS={status}" + (f" reason={reason}" if reason else ""))
    return 1 if status == "FAIL" else 0


def main() -> int:
    # JAX takes most of the GPU's memory at start-up by default; a hello-world needs little.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    try:
        import jax
        import jax.numpy as jnp
        import numpy as np
    except ImportError as exc:
        return finish("FAIL", f"jax not importable: {exc}")
    try:
        import greta_core  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(REPO))  # running from a checkout without installing
    try:
        from greta_core import observe
        from greta_core.jax import vec_add
        from greta_core.jax._runtime import jax_triton_status
    except Exception as exc:
        return finish("FAIL", f"cannot import greta_core.jax: {exc.__class__.__name__}: {exc}")

    print(f"jax {jax.__version__}, backend {jax.default_backend()}, devices {jax.devices()}")
    _usable, why = jax_triton_status()
    print(f"jax-triton: {why}")
    kx, ky = jax.random.split(jax.random.PRNGKey(0))
    failures = []
    for n in (1, 1000, 4099):
        x = jax.random.normal(kx, (n,), dtype=jnp.float32)
        y = jax.random.normal(ky, (n,), dtype=jnp.float32)
        try:
            out = jax.jit(vec_add)(x, y).block_until_ready()
        except Exception as exc:
            return finish("FAIL", f"n={n}: {exc.__class__.__name__}: {exc}".splitlines()[0])
        ref = np.asarray(x, dtype=np.float64) + np.asarray(y, dtype=np.float64)
        err = float(np.max(np.abs(np.asarray(out, dtype=np.float64) - ref)))
        ok = bool(np.isfinite(np.asarray(out)).all()) and err <= 1e-6
        print(f"  n={n:<5} max|err|={err:.2e} {'ok' if ok else 'WRONG'}")
        if not ok:
            failures.append(f"n={n}")
    ran = observe.last_implementation("vec_add")
    print(f"implementation={ran}")
    if failures:
        return finish("FAIL", "wrong results for " + ", ".join(failures))
    if ran == "jax-triton":
        return finish("OK")
    return finish("FALLBACK", f"jnp reference ran ({why})")


if __name__ == "__main__":
    sys.exit(main())
