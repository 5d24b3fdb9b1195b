"""bench/attention_ws.py without a GPU: issue 26's shape grid, how a child's end becomes rows
(results, then a hang / abort and the shapes it never reached), the per-shape summary against
cuDNN, and an sm_90 compile of one config into the warp-specialised form."""

from __future__ import annotations

import json

import pytest
from _script_module import load_script

pytest.importorskip("triton")


@pytest.fixture(scope="module")
def ws():
    return load_script("bench/attention_ws.py", "attention_ws_bench")


def test_grid_is_issue_26s(ws) -> None:
    for d, heads in ((64, 32), (128, 16)):
        grid = ws.shapes(d)
        assert len(grid) == 12  # S 2048/4096/8192 x causal or not x MHA/GQA
        assert {p["S"] for p in grid} == {2048, 4096, 8192}
        assert all(p["B"] * p["S"] == 16384 and p["Hq"] == heads for p in grid)
        assert {p["Hkv"] for p in grid} == {heads, heads // 4}
        assert {p["causal"] for p in grid} == {True, False}
    assert ws.shape_label(ws.shapes(64)[1]) == "B8 H32/8 S2048 D64 GQA4 causal"


ABORT = (
    "python: /x/WSLowerToken.cpp:73: void mlir::processProducerCommitOp(...): "
    "Assertion `false' failed."
)


def test_classify_keeps_results_and_names_where_the_child_stopped(ws) -> None:
    ok = 'RESULT {"shape": "a", "status": "ok", "ms": 1.0}'
    rows = ws.classify(None, f"launching\n{ok}\nlaunching\n", "", 4)
    assert rows[0] == {"shape": "a", "status": "ok", "ms": 1.0}
    assert rows[1]["status"] == "hang" and "launch" in rows[1]["detail"]
    assert [r["status"] for r in rows[2:]] == ["not-run", "not-run"]
    rows = ws.classify(-6, "", f"Traceback\n{ABORT}\n", 2)
    assert rows[0] == {"index": 0, "status": "compile-error", "detail": ABORT}
    rows = ws.classify(-11, f"launching\n{ok}\nlaunching\n", "Segmentation fault\n", 2)
    assert rows[1] == {"index": 1, "status": "crash", "detail": "Segmentation fault"}
    rows = ws.classify(1, "", "Traceback\nImportError: no module\n", 1)
    assert rows[0]["status"] == "failed" and rows[0]["detail"] == "ImportError: no module"
    assert ws.classify(0, f"{ok}\n{ok}\n", "", 2) == [json.loads(ok[7:])] * 2
    # A child that hung before its first launch, or ended silently.
    assert ws.classify(None, "", "", 1)[0]["detail"] == "no result within the time limit (set-up)"
    assert ws.classify(3, "", "", 1) == [{"index": 0, "status": "failed", "detail": "exit code 3"}]


def test_summary_takes_the_best_passing_config_per_pass(ws) -> None:
    base = [{"shape": "s", "status": "ok", "sdpa_backend": "cudnn", "sdpa_fwd_ms": 1.0,
             "sdpa_total_ms": 3.6, "greta_total_ms": 4.5}]  # fmt: skip
    rows = [
        {"config": "fwd 128x64 s2 w4 ws=1", "shape": "s", "status": "ok", "ms": 1.25},
        {"config": "fwd 64x64 s3 w4 ws=0", "shape": "s", "status": "ok", "ms": 1.1},
        {"config": "fwd 128x128 s2 w4 ws=1", "shape": "s", "status": "wrong", "rel_err": 0.5},
        {"config": "fwd-split 128x64 s2 w4 ws=1", "shape": "s", "status": "hang"},
        {"config": "bwd dkdv64x128 dq128x64 s2 w4 ws=1", "shape": "s", "status": "ok", "ms": 2.9},
    ]
    (s,) = ws.summarize(base, rows)
    assert s["best_fwd"] == "fwd 64x64 s3 w4 ws=0" and s["best_bwd_ms"] == 2.9
    assert s["ws_fwd_vs_cudnn"] == round(1.0 / 1.1, 3)
    assert s["ws_vs_cudnn"] == round(3.6 / (1.1 + 2.9), 3)
    assert s["greta_vs_cudnn"] == round(3.6 / 4.5, 3)


def test_unknown_config_is_refused_in_one_line(ws, capsys) -> None:
    with pytest.raises(SystemExit):
        ws.main(["--dry-run", "--only", "fwd:99"])
    assert "fwd:99: no such config" in capsys.readouterr().err.strip().splitlines()[-1]


def test_dry_run_compiles_the_fa3_layout_into_warp_groups(ws, capsys, tmp_path) -> None:
    out = tmp_path / "ws.json"
    assert ws.main(["--dry-run", "--d", "64", "--only", "fwd:0", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    (row,) = doc["rows"]
    assert row["config"] == "fwd 128x64 s2 w4 ws=1" and row["status"] == "compiled", row
    # A producer warp group beside the consumers of the kernel's 4 warps.
    assert row["fwd"]["warp_specialized"] is True and row["fwd"]["num_warps"] > 4
    assert (
        doc["command"]
        == "python bench/attention_ws.py --dry-run --d 64 --only fwd:0 --out <out>/ws.json"
    )
    assert doc["triton"] and doc["head_dim"] == 64
