"""examples/llama_block.py end to end on a small config, in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _script_module import load_script

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent


def test_llama_block_matches_reference(tmp_path: Path) -> None:
    # The example as a user runs it: torch ops on CPU take the torch reference, not the
    # Triton interpreter the rest of the suite asks for.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GRETA_IMPL") and k != "GRETA_TRITON_ON_CPU"
    }
    env["PYTHONPATH"] = str(ROOT)
    # Compile mode through dynamo and AOTAutograd (functionalisation of the KV-cache append
    # included) without inductor's C++ builds: those took 40 of this test's 45 CPU-s here;
    # inductor over GRETA's ops, forward and backward, is test_kernel_norms'.
    env["GRETA_COMPILE_BACKEND"] = "aot_eager"
    args = ["--batch", "2", "--dim", "64", "--heads", "4", "--kv-heads", "2",
            "--prefill-len", "7", "--decode-steps", "3", "--repeats", "1", "--out", str(tmp_path),
            "--modes", "eager,graph,compile"]  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "llama_block.py"), *args],
        capture_output=True, text=True, timeout=600, env=env, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "reference check passed" in done.stdout
    (result,) = tmp_path.glob("llama_block_*.json")
    data = json.loads(result.read_text())
    assert [r["mode"] for r in data["results"]] == ["eager", "graph", "compile"]
    assert all(r["match"] and r["rel_err"] <= r["tolerance"] for r in data["results"])
    assert data["metadata"]["compile_backend"] == "aot_eager"
    assert set(data["metadata"]["implementations"]) >= {"compute.matmul", "compute.attention"}
    assert list(tmp_path.glob("llama_block_*.csv"))


def test_llama_block_rejects_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    # In this process: the script's main is what `python examples/llama_block.py` runs.
    module = load_script("examples/llama_block.py")
    with pytest.raises(SystemExit) as exited:
        module.main(["--dim", "65"])
    assert exited.value.code == 2 and "--dim must split" in capsys.readouterr().err


def test_llama_block_cpu_defaults_are_small() -> None:
    """The first thing a user runs finishes in seconds on a CPU: a small block, no compile."""
    module = load_script("examples/llama_block.py")
    args = module.parse_args(["--device", "cpu"])
    assert (args.dim, args.heads, args.kv_heads) == (256, 8, 2)
    assert args.mode_list == ["eager", "graph"] and args.batches == [1, 4]
    gpu = module.parse_args(["--device", "cuda"])
    assert (gpu.dim, gpu.mode_list) == (2048, ["eager", "graph", "compile"])
    assert module.parse_args(["--device", "cpu", "--dim", "512"]).dim == 512
