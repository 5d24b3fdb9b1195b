"""`greta backends`: the report on this machine, its schema, and its failure modes."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from greta import cli
from greta_core import backends

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    full = {k: v for k, v in full.items() if v is not None}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=full, timeout=300, cwd=ROOT
    )


def _backends(
    monkeypatch: pytest.MonkeyPatch, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    """`greta backends ARGS` through the CLI's entry point in this process, with no
    GRETA_IMPL* variable but `env`'s (a child each cost ~5 CPU-s, most of it importing
    torch again; the probe's own child is test_doctor_summary_runs_the_probe_in_a_subprocess)."""
    for name in [k for k in os.environ if k.startswith("GRETA_IMPL")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["backends", *args])
    return subprocess.CompletedProcess(["backends", *args], code, out.getvalue(), err.getvalue())


def test_backends_json_reports_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    done = _backends(monkeypatch, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["schema"] == backends.SCHEMA
    assert report["torch"]["version"] == torch.__version__
    gpu = torch.cuda.is_available()
    assert (report["torch"]["gpu"] is not None) == gpu
    assert report["platform"] == ("cpu" if not gpu else ("rocm" if torch.version.hip else "cuda"))
    ids = [lib["id"] for lib in report["libraries"]]
    assert ids == ["blas", "dnn", "attention", "graph_compiler", "graphs", "collectives", "triton"]
    for lib in report["libraries"]:
        assert {"nvidia", "amd", "present", "active", "version", "via"} <= set(lib)
        if not gpu and lib["id"] != "triton":
            assert lib["present"] is False  # nothing vendor-side on a CPU-only machine
    ops = {row["op"] for row in report["operations"]}
    assert {"matmul", "attention", "rms_norm", "layer_norm", "softmax", "rope", "conv2d"} <= ops
    # GRETA's kernel for every op it has, wherever it takes the report's case; the vendor
    # library for conv2d on a GPU; on a CPU the torch reference for GEMM and convolution
    # (no vendor GPU library, and GRETA's GEMM is a GPU kernel).
    expected = {op: "greta" for op in ops} | (
        {"conv2d": "vendor"} if gpu else {"matmul": "reference", "conv2d": "reference"}
    )
    for row in report["operations"]:
        assert row["selected"] == expected[row["op"]], row
        for cand in row["candidates"]:
            assert cand["available"] == (cand["reason"] is None)
    names = {s["name"] for s in report["switches"]}
    assert {"TORCH_BLAS_PREFER_HIPBLASLT", "TORCH_ROCM_FA_PREFER_CK", "MIOPEN_FIND_MODE"} <= names
    assert "torch.backends.cuda.preferred_blas_library()" in names


def test_backends_text_and_forced_unavailable_exit_code(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    done = _backends(monkeypatch, GRETA_IMPL_CONV2D="reference")
    assert done.returncode == 0, done.stderr
    assert "cuBLAS / cuBLASLt" in done.stdout and "rocBLAS / hipBLASLt" in done.stdout
    assert "forced by GRETA_IMPL_CONV2D" in done.stdout
    done = _backends(monkeypatch, "--json", GRETA_IMPL_MATMUL="greta")
    report = json.loads(done.stdout)
    row = next(r for r in report["operations"] if r["op"] == "matmul")
    assert row["forced"] == {"impl": "greta", "by": "GRETA_IMPL_MATMUL"}
    greta_ok = next(c for c in row["candidates"] if c["name"] == "greta")["available"]
    assert (done.returncode == 0) == greta_ok
    assert (row["error"] is None) == greta_ok


def test_backends_without_torch() -> None:
    code = (
        "import sys, json; sys.modules['torch'] = None\n"
        "from greta_core import backends\n"
        "r = backends.probe(); print(json.dumps(r)); print(backends.format_text(r), file=sys.stderr)"
    )
    done = _run("-c", code)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["torch"]["installed"] is False
    assert "torch not installed" in report["torch"]["error"]
    assert "torch not installed" in done.stderr
    assert backends.summarize(report)[0]["status"] == "skip"


def test_summarize_flags_forced_errors_and_missing_gpu_libraries() -> None:
    report = {
        "torch": {"installed": True, "gpu": {"name": "X", "arch": "gfx942", "count": 1}},
        "libraries": [
            {"id": "blas", "nvidia": "cuBLAS", "amd": "hipBLASLt", "present": False,
             "active": None, "version": None},
            {"id": "graph_compiler", "nvidia": "TensorRT", "amd": "MIGraphX", "present": False,
             "active": None, "version": None},
        ],
        "operations": [{"op": "matmul", "error": "forced greta unavailable"}],
    }  # fmt: skip
    checks = {c["id"]: c for c in backends.summarize(report)}
    assert checks["backends.blas"]["status"] == "warn"
    assert checks["backends.graph_compiler"]["status"] == "skip"
    assert "torch_migraphx" in checks["backends.graph_compiler"]["fix"]
    assert checks["backends.op.matmul"]["status"] == "fail"


def test_doctor_summary_runs_the_probe_in_a_subprocess() -> None:
    pytest.importorskip("torch")
    checks = backends.doctor_summary()
    assert checks and all(set(c) == {"id", "status", "finding", "fix"} for c in checks)
    assert all(c["status"] in ("ok", "warn", "fail", "skip") for c in checks)
