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
    # Without this checkout on the path (other entries, e.g. carried wheels, stay).
    paths = [p for p in env.pop("PYTHONPATH", "").split(os.pathsep) if p]
    kept = [p for p in paths if Path(p).resolve() != REPO]
    if kept:
        env["PYTHONPATH"] = os.pathsep.join(kept)
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
    # Triton's prototype runs the real kernel everywhere (the interpreter on a CPU); the
    # PyTorch and JAX ones check their GPU path on a GPU (the GPU suite carries jax-triton)
    # and can only fall back to their CPU references without one.
    status = "OK" if name == "triton" or _has_gpu() else "FALLBACK"
    assert last.split(" ")[0] == f"STATUS={status}", proc.stdout[-3000:] + proc.stderr[-3000:]
    if status == "FALLBACK":
        assert last.startswith("STATUS=FALLBACK reason=") and len(last) > len(
            "STATUS=FALLBACK reason="
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    if name == "triton":
        assert ("ran under TRITON_INTERPRET=1" in proc.stdout) != _has_gpu()
    if name == "pytorch":
        assert "autograd ok" in proc.stdout
