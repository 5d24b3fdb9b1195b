"""greta_core.reference is the one reference of every op for torch and JAX alike, and the
JAX executor's choice of which compile options reach jax-triton is made in one place."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from greta_core import reference

ROOT = Path(__file__).resolve().parents[1]

# Runs the reference on JAX arrays in a fresh interpreter and reports whether torch got
# imported: a JAX-only program must be able to run the fallback.
_CHILD = """
import json, sys
import jax.numpy as jnp
from greta_core import reference as ref
x = jnp.arange(24, dtype=jnp.float32).reshape(2, 3, 4) / 7 - 1
w = jnp.linspace(0.5, 1.5, 4, dtype=jnp.float32)
xr = (jnp.arange(2 * 3 * 2 * 4, dtype=jnp.float32).reshape(2, 3, 2, 4) / 11) - 1
pos = jnp.asarray([0, 2, 5], dtype=jnp.int32)
out = {
    "rms_norm": ref.rms_norm(x, w).tolist(),
    "softmax": ref.softmax(x).tolist(),
    "glu": ref.glu(x, x * 2, "gelu_tanh").tolist(),
    "rope_positions": ref.rope_positions(xr, pos, 100.0).tolist(),
    "torch_imported": "torch" in sys.modules,
}
print(json.dumps(out))
"""


def test_reference_runs_on_jax_arrays_without_torch_and_matches_torch() -> None:
    pytest.importorskip("jax")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD], capture_output=True, text=True, env=env, check=True
    )
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["torch_imported"] is False
    x = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) / 7 - 1
    w = torch.linspace(0.5, 1.5, 4, dtype=torch.float32)
    xr = torch.arange(2 * 3 * 2 * 4, dtype=torch.float32).reshape(2, 3, 2, 4) / 11 - 1
    pos = torch.tensor([0, 2, 5], dtype=torch.int32)
    want = {
        "rms_norm": reference.rms_norm(x, w),
        "softmax": reference.softmax(x),
        "glu": reference.glu(x, x * 2, "gelu_tanh"),
        "rope_positions": reference.rope_positions(xr, pos, 100.0),
    }
    for name, expected in want.items():
        torch.testing.assert_close(torch.tensor(got[name]), expected, rtol=1e-6, atol=1e-6)


def test_attention_reference_keeps_jax_gradients_finite_for_rows_without_keys() -> None:
    # The reference's logsumexp is written by hand so that JAX's autodiff of the fallback
    # (attention with lengths) sees no exp(-inf - -inf) behind the where: a padding row
    # (q_len 0 here) must give zero, not NaN, gradients.
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    from greta_core import jax as gj

    key = jax.random.PRNGKey(0)
    q, k, v = (jax.random.normal(kk, (2, 2, 3, 8), jnp.float32) for kk in jax.random.split(key, 3))
    q_lens = jnp.asarray([2, 0], jnp.int32)

    def loss(q: object, k: object, v: object) -> object:
        return gj.attention(q, k, v, True, None, q_lens, None).sum()

    grads = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
    for g in grads:
        assert bool(jnp.all(jnp.isfinite(g)))
    assert bool(jnp.all(grads[0][1] == 0)) and bool(jnp.any(grads[0][0] != 0))


def test_jax_executor_passes_warps_and_stages_and_drops_the_hip_knobs() -> None:
    pytest.importorskip("triton")
    from greta_core.jax._plan import split_options
    from greta_core.ops.matmul import plan

    # gfx942's matmul table sets all three HIP knobs (configs/tables/gfx942.json).
    launch = plan(512, 512, 512, (512, 1), (512, 1), (512, 1), "float16", False, "gfx942")
    options = launch.launches[0].options
    passed, dropped = split_options(options)
    assert passed == {"num_warps": options["num_warps"], "num_stages": options["num_stages"]}
    assert dropped == ("kpack", "matrix_instr_nonkdim", "waves_per_eu")
    assert split_options({"num_warps": 4}) == ({"num_warps": 4}, ())
