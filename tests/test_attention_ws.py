"""bench/attention_ws.py without a GPU: issue 26's shape grid, how a child's end becomes rows
(results, then a hang / abort and the shapes it never reached), the per-shape summary against
cuDNN, and an sm_90 compile of one config into the warp-specialised form."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

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


def _reference(q, k, v, do, causal: bool, scale: float):
    """o, logsumexp and dq, dk, dv in float64 from the same inputs (GQA: each KV head
    serves q.shape[1] // k.shape[1] query heads, its gradient summed over them)."""
    import torch

    group = q.shape[1] // k.shape[1]
    qq, kk, vv = (t.double().requires_grad_() for t in (q, k, v))
    ke, ve = (t.repeat_interleave(group, dim=1) for t in (kk, vv))
    s = qq @ ke.transpose(-1, -2) * scale
    if causal:
        n = q.shape[2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    o = torch.softmax(s, -1) @ ve
    o.backward(do.double())
    return o.detach(), torch.logsumexp(s, -1).detach(), qq.grad, kk.grad, vv.grad


@pytest.mark.parametrize("causal", [True, False])
def test_row_halves_keep_the_kernels_math(ws, causal: bool) -> None:
    """The kernels in Triton's interpreter on a tiny GQA shape, the rows whole (HALVES=1)
    and as the two halves the 128-row warp-specialised layouts use (HALVES=2): both match a
    float64 reference within the bench's own bounds, and each other within one float16 step.
    float16, not the bench's bf16: the kernels take their dtype from the inputs, and Triton
    3.6's interpreter returns garbage for these bf16 kernels (the ones before the halves
    too)."""
    torch = pytest.importorskip("torch")
    from triton.tools.tensor_descriptor import TensorDescriptor

    from greta_core.arch import interpreter_active
    from greta_core.ops import _interp_compat

    if not interpreter_active():  # a GPU machine: the same test, in a child, interpreted
        env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
        test_id = f"{__file__}::test_row_halves_keep_the_kernels_math[{causal}]"
        child = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_id],
            env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert child.returncode == 0, child.stdout[-4000:] + child.stderr[-2000:]
        assert "1 passed" in child.stdout
        return
    assert _interp_compat.apply(), "these launches need Triton's interpreter"

    b, hq, hkv, s, d = 1, 4, 2, 64, 16
    bm, bn = 32, 16  # forward and dq: BLOCK_M x BLOCK_N; dkdv: bn x bm (keys x queries)
    scale, group = 1.0 / math.sqrt(d), hq // hkv
    gen = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(b, h, s, d, generator=gen).to(torch.float16)
                   for h in (hq, hkv, hkv, hq))  # fmt: skip
    ref_o, ref_lse, ref_dq, ref_dk, ref_dv = _reference(q, k, v, do, causal, scale)

    def desc(t, rows: int):
        flat = t.reshape(-1, d)
        return TensorDescriptor(flat, list(flat.shape), list(flat.stride()), [rows, d])

    def rel(a, ref) -> float:
        return float((a.double() - ref).norm() / ref.norm())

    results = {}
    for halves in (1, 2):
        for split in (False, True):
            o = torch.empty_like(q)
            lse = torch.empty(b * hq * s, dtype=torch.float32)
            ws.fwd_kernel[(s // bm, b * hq)](
                desc(q, bm // halves), desc(k, bn), desc(v, bn), o, lse, scale, s, hq, group,
                HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal, SPLIT=split, WS=True,
                HALVES=halves,
            )  # fmt: skip
            assert rel(o, ref_o) <= ws.MAX_REL, (halves, split)
            # fp32 scores of 16-term products and exp2/log2: a few fp32 ulps.
            torch.testing.assert_close(lse.view(b, hq, s).double(), ref_lse, rtol=1e-5, atol=1e-5)
        delta = (o.float() * do.float()).sum(-1).reshape(-1)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        ws.dkdv_kernel[(s // (2 * bm), b * hkv)](
            desc(q, bn), desc(k, 2 * bm // halves), desc(v, 2 * bm // halves), desc(do, bn),
            lse, delta, dk, dv, scale, s, hq, group, HEAD_DIM=d, BLOCK_M=bn, BLOCK_N=2 * bm,
            CAUSAL=causal, WS=True, HALVES=halves,
        )  # fmt: skip
        ws.dq_kernel[(s // bm, b * hq)](
            desc(q, bm // halves), desc(k, bn), desc(v, bn), desc(do, bm // halves), lse,
            delta, dq, scale, s, hq, group, HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal,
            WS=True, HALVES=halves,
        )  # fmt: skip
        for name, got, ref in (("dq", dq, ref_dq), ("dk", dk, ref_dk), ("dv", dv, ref_dv)):
            assert rel(got, ref) <= 2 * ws.MAX_REL, (halves, name)
        results[halves] = (o, dq, dk, dv)
    # Same math per row in the same order; only an fp32 last bit from the matmul's blocking
    # may differ, one float16 step of the stored value at most.
    for whole, half in zip(results[1], results[2], strict=True):
        torch.testing.assert_close(half, whole, rtol=2**-10, atol=0)
