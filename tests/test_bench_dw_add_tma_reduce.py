"""bench/dw_add_tma_reduce.py: the kernel's sm_90 code (compiled here, no GPU) and its refusal
without one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parent.parent

# Compiles the bench's kernel for sm_90 (bf16, 256-row chunks) as the kernel-wheel build
# does, without a GPU, and prints the PTX lines of the first chunk's variant and the others'.
_COMPILE = r"""
import json, sys, tempfile
sys.path.insert(0, "bench")
import triton.language as tl
from triton.runtime.jit import MockTensor
from greta_core.kernel_wheels import aot
import dw_add_tma_reduce as bench

out = {}
for first in (True, False):
    ptr = MockTensor(tl.bfloat16)
    with tempfile.TemporaryDirectory() as d, aot.compiling_for("sm_90", d):
        bench.dw_add_kernel.device_caches.clear()
        compiled = bench.dw_add_kernel.warmup(
            ptr, ptr, ptr, 128256, 2048, 256, BLOCK_V=128, BLOCK_H=128, BLOCK_R=64,
            PROGRAMS=264, FIRST=first, num_warps=4, num_stages=3, grid=(1,))
    out[str(first)] = [line.strip() for line in compiled.asm["ptx"].splitlines()]
print(json.dumps(out))
"""


def test_the_add_is_a_tma_reduction_and_the_first_chunk_a_tma_store() -> None:
    """What the bench's docstring claims, in Triton's own sm_90 lowering: the products run
    on wgmma from TMA loads; every chunk but the first adds its tile with one bulk tensor
    reduction (C is never loaded), the first stores it."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    proc = subprocess.run([sys.executable, "-c", _COMPILE], env=env, capture_output=True,
                          text=True, timeout=300, check=True, cwd=ROOT)  # fmt: skip
    ptx = json.loads(proc.stdout.splitlines()[-1])
    for lines in ptx.values():
        assert any(line.startswith("wgmma.mma_async") and ".bf16.bf16" in line for line in lines)
        loads = [line for line in lines if "cp.async.bulk.tensor.2d.shared::cluster.global" in line]
        assert len(loads) >= 2  # the g and h tiles
    reduce = "cp.reduce.async.bulk.tensor.2d.global.shared::cta.add"
    store = "cp.async.bulk.tensor.2d.global.shared::cta"
    assert any(reduce in line for line in ptx["False"])
    assert not any(store in line for line in ptx["False"])
    assert any(store in line for line in ptx["True"])
    assert not any(reduce in line for line in ptx["True"])


def test_without_a_tma_gpu_the_bench_refuses_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import dw_add_tma_reduce as bench
    finally:
        sys.path.remove(str(ROOT / "bench"))
    assert bench.main(["--out", str(tmp_path / "x.json")]) == 2
    assert capsys.readouterr().err.strip() == (
        "dw_add_tma_reduce: needs a CUDA GPU with TMA (sm_90 or newer)"
    )
    assert not (tmp_path / "x.json").exists()
