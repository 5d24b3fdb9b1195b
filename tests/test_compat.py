"""The runnable prototypes under compat/: each ends with a STATUS line and exits 0 unless FAIL."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PROTOTYPES = {
    "triton": REPO / "compat" / "triton" / "vec_add.py",
    "pytorch": REPO / "compat" / "pytorch" / "greta_extension_hello.py",
    "jax": REPO / "compat" / "jax" / "jax_custom_call_hello.py",
}
NEEDS = {"triton": ("torch", "triton"), "pytorch": ("torch", "triton"), "jax": ("jax", "triton")}


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.parametrize("name", sorted(PROTOTYPES))
def test_prototype_runs_from_a_checkout(name: str, tmp_path: Path) -> None:
    for module in NEEDS[name]:
        pytest.importorskip(module)
    env = dict(os.environ)
    # The prototypes must decide about the interpreter themselves and find greta_core
    # without installation: run them from elsewhere, with neither hint set.
    env.pop("TRITON_INTERPRET", None)
    env.pop("GRETA_TRITON_ON_CPU", None)
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [sys.executable, str(PROTOTYPES[name])],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr[-3000:]
    last = lines[-1]
    assert last == "STATUS=OK" or last.startswith("STATUS=FALLBACK reason="), (
        proc.stdout[-3000:] + proc.stderr[-3000:]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    if name == "triton":
        # On a CPU machine the real kernel runs under the interpreter: still OK.
        assert last == "STATUS=OK"
        assert ("ran under TRITON_INTERPRET=1" in proc.stdout) != _has_gpu()
    if name == "pytorch":
        assert (last == "STATUS=OK") == _has_gpu()
        assert "autograd ok" in proc.stdout
