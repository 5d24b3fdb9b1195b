"""Tensor parallelism: the sharding in greta_core.distributed, and examples/llama_block_tp.py
run by torchrun with gloo on 2 CPU processes against the single-device block."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from greta_core.distributed import (  # noqa: E402
    GretaShardingError,
    column_shard,
    row_shard,
    shard_llama_weights,
)

ROOT = Path(__file__).resolve().parent.parent


def _rand(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_column_shard_splits_each_fused_part() -> None:
    w = torch.arange(2 * 12).reshape(2, 12)  # columns: q 0..5 | k 6..8 | v 9..11
    with pytest.raises(GretaShardingError, match="part 1"):
        column_shard(w, 0, 2, [6, 3, 3])
    w = torch.arange(2 * 8).reshape(2, 8)  # q 0..3 | k 4..5 | v 6..7
    assert column_shard(w, 1, 2, [4, 2, 2])[0].tolist() == [2, 3, 5, 7]
    assert column_shard(w, 0, 2)[0].tolist() == [0, 1, 2, 3]


def test_row_shard_and_bad_arguments() -> None:
    w = torch.arange(6 * 2).reshape(6, 2)
    assert row_shard(w, 2, 3).tolist() == [[8, 9], [10, 11]]
    with pytest.raises(GretaShardingError, match="rows = 6 does not split over 4"):
        row_shard(w, 0, 4)
    with pytest.raises(GretaShardingError, match="rank 3 is outside"):
        row_shard(w, 3, 3)
    with pytest.raises(GretaShardingError, match="add up"):
        column_shard(w, 0, 2, [1, 2])


def test_column_then_row_parallel_mlp_sums_to_the_full_mlp() -> None:
    d, hidden, world = 8, 12, 3
    h, w13, w2 = _rand(5, d, seed=1), _rand(d, 2 * hidden, seed=2), _rand(hidden, d, seed=3)
    gate, up = (h @ w13).chunk(2, dim=-1)
    full = (F.silu(gate) * up) @ w2
    partial = []
    for r in range(world):
        g, u = (h @ column_shard(w13, r, world, [hidden, hidden])).chunk(2, dim=-1)
        partial.append((F.silu(g) * u) @ row_shard(w2, r, world))
    torch.testing.assert_close(sum(partial), full)


def test_llama_shards_keep_each_query_head_with_its_kv_head() -> None:
    heads, kv_heads, hd, hidden, d, world = 4, 2, 2, 6, 8, 2
    q, kv = heads * hd, kv_heads * hd
    weights = {
        "attn_norm": _rand(d, seed=4),
        "wqkv": _rand(d, q + 2 * kv, seed=5),
        "wo": _rand(q, d, seed=6),
        "mlp_norm": _rand(d, seed=7),
        "w13": _rand(d, 2 * hidden, seed=8),
        "w2": _rand(hidden, d, seed=9),
    }
    shards = [
        shard_llama_weights(
            weights, heads=heads, kv_heads=kv_heads, head_dim=hd, hidden=hidden, rank=r, world=world
        )
        for r in range(world)
    ]
    full_q, full_k, _ = weights["wqkv"].split([q, kv, kv], dim=1)
    for r, s in enumerate(shards):
        sq, sk, _ = s["wqkv"].split([q // world, kv // world, kv // world], dim=1)
        # Rank r: query heads 2r, 2r+1 (columns 4r..4r+3) and their shared kv head r.
        torch.testing.assert_close(sq, full_q[:, 4 * r : 4 * r + 4])
        torch.testing.assert_close(sk, full_k[:, 2 * r : 2 * r + 2])
        assert s["attn_norm"] is weights["attn_norm"]
    # The output projection's row blocks line up with the query heads.
    torch.testing.assert_close(torch.cat([s["wo"] for s in shards]), weights["wo"])
    with pytest.raises(GretaShardingError, match="key/value heads = 2 does not split over 4"):
        shard_llama_weights(weights, heads=4, kv_heads=2, head_dim=hd, hidden=8, rank=0, world=4)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_torchrun_two_cpu_ranks_match_the_single_device_block(tmp_path: Path) -> None:
    # As a user runs it: torch ops on CPU take the torch paths, not the Triton interpreter.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GRETA_IMPL") and k != "GRETA_TRITON_ON_CPU"
    }
    env["PYTHONPATH"] = str(ROOT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
           str(ROOT / "examples" / "llama_block_tp.py"), "--device", "cpu", "--batch", "2",
           "--dim", "64", "--heads", "4", "--kv-heads", "2", "--prefill-len", "7",
           "--decode-steps", "3", "--repeats", "1", "--modes", "eager,graph",
           "--out", str(tmp_path)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tensor-parallel check passed" in done.stdout
    (result,) = tmp_path.glob("llama_block_tp_cpu_x2_*.json")
    data = json.loads(result.read_text())
    assert data["world"] == 2 and data["backend"] == "gloo" and data["match"] is True
    assert data["rel_err_vs_single_device"] <= data["tolerance"] == 1e-4
    assert data["single_device_prefill_ms"] > 0 and data["single_device_decode_step_ms"] > 0
    assert data["rel_err_vs_reference"] <= data["tolerance"]
    # A GretaGraph on the CPU runs eagerly: both modes, both matching.
    assert {m: r["backend"] for m, r in data["modes"].items()} == {
        "eager": "eager", "graph": "eager",
    }  # fmt: skip
    assert all(r["rel_err_vs_single_device"] <= 1e-4 for r in data["modes"].values())
    assert {"matmul", "attention", "rms_norm"} <= set(data["implementations"])


@pytest.mark.gpu
def test_torchrun_two_gpus_match_the_single_device_block(tmp_path: Path) -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
           str(ROOT / "examples" / "llama_block_tp.py"), "--dim", "1024", "--heads", "16",
           "--kv-heads", "4", "--batch", "4", "--prefill-len", "32", "--decode-steps", "8",
           "--repeats", "3", "--out", str(tmp_path)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    (result,) = tmp_path.glob("llama_block_tp_*_x2_*.json")
    data = json.loads(result.read_text())
    assert data["backend"] == "nccl" and data["match"] is True
    assert data["rel_err_vs_single_device"] <= data["tolerance"]
    assert data["single_device_prefill_ms"] > 0 and data["single_device_decode_step_ms"] > 0
    # On GPUs both modes run; the graph one captured the block with its all-reduces.
    graph = data["modes"]["graph"]
    assert graph["backend"] == ("hip-graph" if torch.version.hip else "cuda-graph")
    assert graph["match"] is True
    assert graph["rel_err_vs_single_device"] <= data["tolerance"]
