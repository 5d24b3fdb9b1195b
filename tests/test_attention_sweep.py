"""bench/attention_sweep.py without a GPU: its candidate checks, its pick and the table
entries it prints (resolved through the real configs.lookup)."""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import pytest
from _script_module import load_script

from greta_core import configs
from greta_core.kernels.attention import features

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sweep():
    return load_script("bench/attention_sweep.py")


def test_dry_run_lists_only_valid_candidates(sweep, tmp_path: Path, capsys) -> None:
    assert sweep.main(["--dry-run", "--out", str(tmp_path / "dry")]) == 0
    report = json.loads((tmp_path / "dry.json").read_text())
    total = 0
    for kernel in sweep.KERNELS:
        entry = report["kernels"][kernel]
        assert entry["missing_kernel_params"] == []
        for d in ("D64", "D128"):
            cands = entry["candidates"][d]
            assert cands, f"{kernel} {d}: no candidates"
            assert all(c["problems"] == [] for c in cands)
            assert all(c["smem_bytes"] <= sweep.SMEM_LIMIT for c in cands)
            total += len(cands)
    # Small enough for a ~5 minute run (compiles cost 1-3 s each on the H100 host).
    assert total == report["compiles_for_full_sweep"] <= 100
    assert "problems" in capsys.readouterr().out


def test_problems_reject_what_sm90_cannot_compile(sweep) -> None:
    ok = {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3}
    assert sweep.problems("fwd", ok, 128) == []
    # 4 stages of 128x128 K and V tiles at D128: 288 KiB of shared memory.
    assert any("shared memory" in p for p in sweep.problems("fwd", ok | {"num_stages": 4}, 128))
    assert sweep.problems("fwd", ok | {"num_stages": 4}, 64) == []
    assert any("power of two" in p for p in sweep.problems("dq", ok | {"BLOCK_N": 48}, 64))
    assert any("warps" in p for p in sweep.problems("dq", ok | {"num_warps": 2}, 64))
    # dkdv's products have BLOCK_N rows: 64 rows cannot feed 8 warps 16 rows each... 128 can.
    small = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2}
    assert sweep.problems("dkdv", small, 64)
    assert sweep.problems("dkdv", small | {"BLOCK_N": 128}, 64) == []


def test_pick_takes_the_fastest_over_all_shapes_and_ignores_failures(sweep) -> None:
    per_shape = {
        "s1": {"a": 1.0, "b": 0.9, "c": float("inf"), "d": 0.1},
        "s2": {"a": 2.0, "b": 1.9, "c": 0.5},
    }
    # d was not timed on s2, c failed on s1: b beats a on both.
    assert sweep.pick(per_shape) == "b"
    assert sweep.pick({"s1": {"a": float("inf")}}) is None
    assert sweep.pick({}) is None


def test_table_entries_resolve_to_the_best_configs(sweep, monkeypatch) -> None:
    def cfg(m: int, n: int, w: int, s: int) -> dict[str, int]:
        return {"BLOCK_M": m, "BLOCK_N": n, "num_warps": w, "num_stages": s}

    best = {
        "fwd": {
            (128, True): cfg(128, 64, 8, 3),
            (128, False): cfg(128, 128, 8, 2),
            (64, True): cfg(64, 64, 4, 4),
        },
        "dkdv": {128: cfg(64, 128, 8, 2), 64: cfg(32, 64, 4, 3)},
        "dq": {128: cfg(128, 32, 8, 2), 64: cfg(64, 32, 4, 2)},
    }
    table = copy.deepcopy(configs.load_table("sm_90"))
    entries = sweep.table_entries(best, table["ops"]["attention"])
    table["ops"].update(json.loads(json.dumps(entries)))  # what a paste into the JSON gives
    monkeypatch.setattr(configs, "load_table", lambda arch: table)

    def fwd(d: int, s: int, causal: bool) -> dict:
        return configs.lookup("attention", "sm_90", features(d, s, s, causal))

    assert fwd(128, 4096, True) == best["fwd"][(128, True)]
    assert fwd(128, 2048, False) == best["fwd"][(128, False)]
    assert fwd(64, 2048, True) == best["fwd"][(64, True)]
    assert fwd(64, 2048, False) == best["fwd"][(64, True)]  # not swept: the causal tiles
    assert fwd(128, 1, True)["BLOCK_M"] == 16  # the decode rule stays first
    for kernel, op in (("dkdv", "attention_bwd_dkdv"), ("dq", "attention_bwd_dq")):
        for d in (64, 128):
            got = configs.lookup(op, "sm_90", {"D": d, "backend": "cuda"})
            assert got == best[kernel][d]


def test_kernels_option_takes_known_names_only(sweep) -> None:
    assert sweep._kernel_list("dkdv, dq") == ("dkdv", "dq")
    with pytest.raises(argparse.ArgumentTypeError, match="unknown kernels"):
        sweep._kernel_list("dkdv,split")


def test_bwd_grid_is_the_plans(sweep) -> None:
    """The sweep launches each backward kernel on the plan's grid: dkdv one program per key
    block and KV head (it sums the GQA group), dq one per query block and query head."""
    cfg = {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 8, "num_stages": 2}
    shape = (4, 32, 8, 2048, 128, True)
    assert sweep.bwd_grid(shape, "dkdv", cfg, "sm_90") == (2048 // 128, 4 * 8)
    assert sweep.bwd_grid(shape, "dq", cfg, "sm_90") == (2048 // 64, 4 * 32)
