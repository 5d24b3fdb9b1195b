"""AOT compilation for GPU archs on this (GPU-less) machine.

Each test runs the compiler in a child process without TRITON_INTERPRET: conftest sets
it for the kernel tests, and under it @triton.jit gives interpreted functions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600
    )


def test_wheel_build_reports_each_compiled_spec(gfx942_wheel: dict) -> None:
    """The AOT rows of the session's small gfx942 wheel (conftest): every spec compiled,
    keyed and described; the whole library is the `slow` test below."""
    assert gfx942_wheel["module_errors"] == []
    bad = [(r["spec"], r["error"]) for r in gfx942_wheel["results"] if not r["ok"]]
    assert not bad, bad
    # Derived specs are named kernel[pointer dtypes;constexprs] (ops/declare.py).
    ragged = {
        r["spec"].partition(";")[0] for r in gfx942_wheel["results"] if r["variant"] == "ragged"
    }
    assert {f"vec_add_kernel[{d},{d},{d}" for d in ("fp32", "fp16", "bf16")} <= ragged
    for r in gfx942_wheel["results"]:
        assert r["arch"] == "gfx942"
        assert len(r["key"]) == 64
        assert r["signature"]
        assert r["matrix_instructions"] == []  # elementwise and reduction kernels


@pytest.mark.slow
def test_aot_report_for_gfx942_covers_every_kernel(tmp_path: Path) -> None:
    report = tmp_path / "aot.json"
    # aligned only: one compile per spec keeps this quick; the ragged variant is the
    # same code path with other int values.
    proc = _run(
        [
            "-m",
            "greta_core.kernel_wheels.aot",
            "--arch",
            "gfx942",
            "--variants",
            "aligned",
            "--report",
            str(report),
        ],
        tmp_path,
    )
    assert report.is_file(), proc.stderr
    data = json.loads(report.read_text())
    assert data["module_errors"] == [], data["module_errors"]
    bad = [(r["spec"], r["error"]) for r in data["results"] if not r["ok"]]
    assert not bad, bad
    assert proc.returncode == 0, proc.stdout + proc.stderr
    specs = {r["spec"].partition(";")[0] for r in data["results"]}
    assert {f"vec_add_kernel[{d},{d},{d}" for d in ("fp32", "fp16", "bf16")} <= specs
    for r in data["results"]:
        assert r["arch"] == "gfx942"
        assert len(r["key"]) == 64
        assert r["signature"]  # what the JIT specialised
        if r["uses_matrix_units"]:
            # Every GEMM/attention spec must reach the MI300X matrix cores.
            assert any(m.startswith("v_mfma") for m in r["matrix_instructions"]), r["spec"]
        if r["spec"].startswith("vec_add"):
            assert r["matrix_instructions"] == []
    assert data["environment"]["triton"]


def test_aot_rejects_unknown_arch(tmp_path: Path) -> None:
    proc = _run(["-m", "greta_core.kernel_wheels.aot", "--arch", "volta"], tmp_path)
    assert proc.returncode == 2
    assert "unrecognised GPU arch" in proc.stderr
    assert "Traceback" not in proc.stderr


DOT_KERNEL = """
import triton
import triton.language as tl


@triton.jit
def tiny_dot(a_ptr, b_ptr, c_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    a = tl.load(a_ptr + offs[:, None] * BLOCK + offs[None, :])
    b = tl.load(b_ptr + offs[:, None] * BLOCK + offs[None, :])
    c = tl.dot(a, b)
    tl.store(c_ptr + offs[:, None] * BLOCK + offs[None, :], c)
"""

DOT_DRIVER = """
import json, sys
import tiny_dot_kernel
from greta_core.kernel_wheels.aot import compile_spec, compiling_for
from greta_core.kernels._aot import AotSpec

out = {}
for arch in sys.argv[2].split(","):
    spec = AotSpec(
        name="tiny_dot[fp16]",
        kernel=tiny_dot_kernel.tiny_dot,
        signature={"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32"},
        constexprs={"BLOCK": 64},
        options={"num_warps": 4},
        uses_matrix_units=True,
    )
    with compiling_for(arch, sys.argv[1]):
        res = compile_spec(spec, "tiny_dot_kernel", arch, "aligned")
    out[arch] = {"ok": res.ok, "error": res.error, "mi": res.matrix_instructions}
print(json.dumps(out))
"""


@pytest.mark.slow
def test_matrix_instruction_detection_per_arch(tmp_path: Path) -> None:
    (tmp_path / "tiny_dot_kernel.py").write_text(textwrap.dedent(DOT_KERNEL))
    (tmp_path / "drive.py").write_text(DOT_DRIVER)
    proc = _run(["drive.py", str(tmp_path / "cache"), "gfx942,gfx1100,gfx1201,sm_90"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for arch, row in out.items():
        assert row["ok"], (arch, row["error"])
    assert any(m.startswith("v_mfma") for m in out["gfx942"]["mi"]), out["gfx942"]
    assert any(m.startswith("v_wmma") for m in out["gfx1100"]["mi"]), out["gfx1100"]
    assert any(m.startswith("v_wmma") for m in out["gfx1201"]["mi"]), out["gfx1201"]
    assert any(m.startswith("wgmma.mma_async") for m in out["sm_90"]["mi"]), out["sm_90"]


def _locked_triton_versions() -> list[str]:
    """Every Triton version a lock file pins (triton or triton-rocm), oldest first."""
    import re

    found = set()
    for lock in (ROOT / "lock" / "targets").glob("*.txt"):
        found |= set(re.findall(r"^triton(?:-rocm)?==([0-9.]+)", lock.read_text(), re.M))
    return sorted(found, key=lambda v: tuple(int(p) for p in v.split(".")))


# The kernels that reach the matrix units (MFMA on CDNA, WMMA on RDNA3/4, wgmma on Hopper).
AOT_SUBSET = "matmul,attention"


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.parametrize("version", _locked_triton_versions())
def test_aot_subset_compiles_with_every_locked_triton(tmp_path: Path, version: str) -> None:
    """The matrix-unit kernels compile for gfx942, gfx1100, gfx1201 and sm_90 with each Triton
    the lock pins (PyPI's triton wheel of that version carries both backends)."""
    import triton

    env = _env()
    if version != triton.__version__.split("+")[0]:
        target = tmp_path / "triton"
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
             str(target), f"triton=={version}"],
            check=True, timeout=600,
        )  # fmt: skip
        env["PYTHONPATH"] = os.pathsep.join([str(target), env["PYTHONPATH"]])
    report = tmp_path / "aot.json"
    proc = subprocess.run(
        [sys.executable, "-m", "greta_core.kernel_wheels.aot", "--arch",
         "gfx942,gfx1100,gfx1201,sm_90", "--kernels", AOT_SUBSET, "--variants", "aligned",
         "--report", str(report), "--quiet"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert report.is_file(), proc.stderr[-3000:]
    data = json.loads(report.read_text())
    assert data["environment"]["triton"].split("+")[0] == version
    bad = [(r["arch"], r["spec"], r["error"][:200]) for r in data["results"] if not r["ok"]]
    assert not bad and data["module_errors"] == [], (bad, data["module_errors"])
    unmatched = [(r["arch"], r["spec"]) for r in data["results"] if not r["matrix_ok"]]
    assert not unmatched, unmatched
    assert {r["arch"] for r in data["results"]} == {"gfx942", "gfx1100", "gfx1201", "sm_90"}
