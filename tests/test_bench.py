"""`greta bench`: pure cost/ratio logic, and the smoke preset end to end in a subprocess."""

from __future__ import annotations

import csv
import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from greta_core.bench import cases, report
from greta_core.bench.runner import case_summaries, rotation_sets
from greta_core.commands.bench import parse_ops

REPO = Path(__file__).resolve().parents[1]
STATUSES = {"ok", "skipped", "error"}


def test_cost_counts_each_input_once_and_each_output_once() -> None:
    mm = cases.cost("matmul", {"m": 3, "n": 5, "k": 7}, 2)
    assert mm.flops == 2 * 3 * 5 * 7
    assert mm.bytes_moved == (3 * 7 + 7 * 5 + 3 * 5) * 2
    assert mm.bound == "compute"
    assert cases.cost("vec_add", {"n": 10}, 4).bytes_moved == 3 * 10 * 4
    rms = cases.cost("rms_norm", {"rows": 4, "cols": 8}, 2)
    assert rms.bytes_moved == (2 * 4 * 8 + 8) * 2 and rms.bound == "memory"
    # GQA reads fewer K/V bytes than MHA at the same query heads.
    mha = cases.cost("attention", {"b": 1, "hq": 8, "hkv": 8, "s": 64, "d": 32}, 2)
    gqa = cases.cost("attention", {"b": 1, "hq": 8, "hkv": 2, "s": 64, "d": 32}, 2)
    assert gqa.bytes_moved < mha.bytes_moved and gqa.flops == mha.flops


def test_every_preset_case_has_a_cost_and_label() -> None:
    for preset in cases.PRESETS:
        for op, params in cases.select(preset, None):
            assert op in cases.OPS
            assert cases.cost(op, params, 2).bytes_moved > 0
            assert cases.describe(op, params)


def test_perf_preset_holds_the_issue_sizes() -> None:
    perf = cases.select("perf", None)
    assert ("matmul", {"m": 8192, "n": 8192, "k": 8192}) in perf
    assert ("rms_norm", {"rows": 8192, "cols": 8192}) in perf
    attention = [p for op, p in perf if op == "attention"]
    assert {p["hkv"] for p in attention} == {32, 8}
    assert all(p["s"] == 4096 and p["d"] == 128 and p["b"] == 4 for p in attention)


def test_select_rejects_unknown_ops_and_presets() -> None:
    with pytest.raises(ValueError, match="unknown op"):
        cases.select("smoke", ["rms_norm", "nope"])
    with pytest.raises(ValueError, match="unknown preset"):
        cases.select("huge", None)
    assert {op for op, _ in cases.select("smoke", ["softmax"])} == {"softmax"}


def test_parse_ops_accepts_spaces_and_commas() -> None:
    assert parse_ops(["rms_norm,softmax", "matmul"]) == ("rms_norm", "softmax", "matmul")


def test_rotation_sets() -> None:
    l2 = 50_000_000
    assert rotation_sets(200_000_000, l2) == 1
    assert rotation_sets(30_000_000, l2) == 4  # covers 2x the L2
    assert rotation_sets(1000, l2) == 8  # capped


def _row(impl: str, ms: float | None, status: str = "ok", bound: str = "compute") -> report.Row:
    return {
        "op": "attention",
        "shape": "s",
        "dtype": "bfloat16",
        "impl": impl,
        "status": status,
        "median_ms": ms,
        "bytes_moved": 2_000_000_000,
        "flops": 10**12,
        "bound": bound,
    }


def test_derive_rates_ratios_against_best_vendor_and_ceilings() -> None:
    rows = [
        _row("greta", 2.0),
        _row("vendor:FLASH_ATTENTION", 4.0),
        _row("vendor:CUDNN_ATTENTION", 3.0),
        _row("vendor:EFFICIENT_ATTENTION", None, status="skipped"),
        _row("torch.compile", 6.0),
    ]
    ceilings = {"copy": {"gbps": 2000.0}, "matmul": {"tflops": 1000.0}}
    out = {r["impl"]: r for r in report.derive(rows, ceilings)}
    greta = out["greta"]
    assert math.isclose(greta["tflops"], 500.0)
    assert math.isclose(greta["gbps"], 1000.0)
    assert math.isclose(greta["pct_matmul_peak"], 50.0)
    assert math.isclose(greta["pct_copy_bw"], 50.0)
    assert math.isclose(greta["speedup_vs_vendor"], 1.5)  # best vendor: 3 ms
    assert math.isclose(greta["speedup_vs_compile"], 3.0)
    assert greta["vendor_best"] == "vendor:CUDNN_ATTENTION"
    assert "gbps" not in out["vendor:EFFICIENT_ATTENTION"]


def test_case_summary_status_is_the_greta_rows() -> None:
    rows = [
        _row("vendor", 1.0) | {"op": "rope"},
        _row("greta", None, status="skipped") | {"op": "rope", "reason": "not registered"},
    ]
    (summary,) = case_summaries(rows)
    assert summary["status"] == "skipped" and summary["reason"] == "not registered"
    assert summary["impls"] == {"vendor": "ok", "greta": "skipped"}


def test_bad_ops_is_a_clear_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from greta.cli import main

    assert main(["bench", "--ops", "bogus", "--out", str(tmp_path)]) == 2
    assert "unknown op(s): bogus" in capsys.readouterr().err


def test_perf_preset_on_cpu_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the perf preset would really run")
    from greta.cli import main

    assert main(["bench", "--preset", "perf", "--out", str(tmp_path)]) == 2
    assert "needs a GPU" in capsys.readouterr().err


@pytest.fixture(scope="module")
def smoke_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess[str], Path]:
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    out = tmp_path_factory.mktemp("bench") / "out"
    env = dict(os.environ, PYTHONPATH=str(REPO), MPLBACKEND="Agg")
    proc = subprocess.run(
        [sys.executable, "-m", "greta", "bench", "--preset", "smoke", "--out", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc, out


@pytest.mark.slow
def test_smoke_bench_writes_csv_json_png(
    smoke_run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    proc, out = smoke_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("bench.csv", "bench.json", "bench.png", "overhead.csv"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    doc = json.loads((out / "bench.json").read_text())
    meta = doc["metadata"]
    for key in (
        "date",
        "preset",
        "python",
        "versions",
        "commit",
        "device",
        "gpu_name",
        "driver",
        "cuda_version",
        "hip_version",
        "dtype",
    ):
        assert key in meta, key
    assert meta["preset"] == "smoke"
    assert {"torch", "triton", "jax"} <= set(meta["versions"])
    host = socket.gethostname()
    if len(host) > 3:
        assert host not in (out / "bench.json").read_text()
    for name in ("copy", "matmul"):
        assert doc["ceilings"][name]["status"] == "ok", doc["ceilings"][name]

    # Every case of the preset is present, each with a status (and a reason when not ok).
    smoke_ops = {op for op, _ in cases.select("smoke", None)}
    assert {c["op"] for c in doc["cases"]} == smoke_ops
    assert len(doc["cases"]) == len(cases.select("smoke", None))
    for row in doc["results"] + doc["overhead"] + doc["cases"]:
        assert row["status"] in STATUSES, row
        if row["status"] != "ok":
            assert row["reason"], row
    # The vendor path exists for every op on every machine (attention: some SDPA backend).
    for case in doc["cases"]:
        vendor = [s for impl, s in case["impls"].items() if report.is_vendor(impl)]
        assert "ok" in vendor, case

    results = {(r["op"], r["impl"]): r for r in doc["results"]}
    greta_add = results[("vec_add", "greta")]
    assert greta_add["status"] == "ok"
    # The run inherits this suite's interpreter settings on a CPU (conftest).
    torch = pytest.importorskip("torch")
    on_gpu = torch.cuda.is_available()
    assert greta_add["implementation_ran"] == ("triton" if on_gpu else "triton-interpret")
    assert greta_add["check_rel_err"] is not None and greta_add["check_rel_err"] < 1e-5
    assert greta_add["gbps"] > 0 and greta_add["speedup_vs_vendor"] > 0

    with (out / "bench.csv").open() as fh:
        reader = csv.DictReader(fh)
        assert tuple(reader.fieldnames or ()) == report.FIELDS
        assert len(list(reader)) == len(doc["results"])
    bindings = {r["binding"] for r in doc["overhead"]}
    assert "torch.ops.greta.vec_add" in bindings and "raw Triton trivial kernel" in bindings
