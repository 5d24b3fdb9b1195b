"""The smoke test: proves an environment runs, and a failure undoes the install.

Fault injection puts a broken module first on the child's path (a torch whose import
crashes, a Triton whose compiler raises) or hides the GPU; the real `greta install`
then runs against a fresh venv with tiny wheels from a local index, and the venv must
be byte-identical afterwards, the message naming the failed step, the doctor check and
the fix.
"""

from __future__ import annotations

import hashlib
import site
import subprocess
import sys
from pathlib import Path

import pytest
from _install_helpers import (
    PY,
    REPO,
    Index,
    copy_venv,
    create_venv,
    make_wheel,
    python_of,
    snapshot,
)

from greta_install import smoke
from greta_install.lockfile import Lock, LockedPackage, format_lock

CRASHING_TORCH = "raise ImportError('libtorch_cpu.so: cannot open shared object file')\n"
BROKEN_TRITON = """
__version__ = "0.0-broken"
def jit(fn=None, **kw):
    raise RuntimeError("triton: failed to compile: LLVM ERROR: no target for this GPU")
def cdiv(a, b):
    return -(-a // b)
"""


def _fault_dir(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "faults"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _child_pythonpath(*first: Path) -> str:
    # The faults first, then GRETA and this interpreter's own packages (torch, triton, jax).
    return ":".join([*map(str, first), str(REPO), *site.getsitepackages()])


def test_parse_output_ignores_noise_and_failure_names_step_doctor_and_fix() -> None:
    out = "\n".join(
        [
            "Warning: something from a library",
            '{"step": "torch", "ok": true, "seconds": 1.5, "detail": {}, "error": null}',
            "{not json",
            '{"step": "triton", "ok": false, "seconds": 0.2, "detail": null, "error": "boom"}',
            '{"no_step": 1}',
        ]
    )
    steps = smoke.parse_output(out)
    assert [(s.name, s.ok) for s in steps] == [("torch", True), ("triton", False)]
    report = smoke.SmokeReport("cpu", steps, returncode=1)
    assert not report.ok and report.failed is not None and report.failed.name == "triton"
    message = report.failure_message()
    assert "step 'triton' failed: boom" in message
    assert "doctor: triton.*" in message and "fix: greta doctor" in message
    clean = smoke.SmokeReport("cpu", steps[:1], returncode=0)
    assert clean.ok and clean.failure_message() == ""
    # Exit 0 without any step reported is not a pass.
    assert not smoke.SmokeReport("cpu", [], returncode=0).ok


def test_a_hanging_child_is_killed_and_reported(tmp_path: Path) -> None:
    faults = _fault_dir(tmp_path, {"torch/__init__.py": "import time\ntime.sleep(600)\n"})
    env = {"PYTHONPATH": _child_pythonpath(faults), "PATH": "/usr/bin:/bin"}
    report = smoke.run_smoke(sys.executable, "cpu", timeout=3, env=env)
    assert report.timed_out and not report.ok
    assert "did not finish in time" in report.failure_message()


@pytest.mark.slow
def test_cpu_smoke_passes_here_and_reports_each_step() -> None:
    env = {"PYTHONPATH": _child_pythonpath(), "PATH": "/usr/bin:/bin"}
    report = smoke.run_smoke(sys.executable, "cpu", env=env)
    assert report.ok, report.to_json()
    assert [s.name for s in report.steps] == list(
        ("torch", "matmul", "triton", "sdpa", "greta-raw", "greta-torch", "jax", "greta-jax")
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("faults", "mode", "extra_env", "step", "words"),
    [
        ({"torch/__init__.py": CRASHING_TORCH}, "cpu", {}, "torch", "libtorch_cpu.so"),
        ({"triton/__init__.py": BROKEN_TRITON, "triton/language.py": ""}, "cpu", {}, "triton", "failed to compile"),
        ({}, "gpu", {"CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": ""}, "torch", "sees no GPU"),
    ],
    ids=["import-crash", "triton-cannot-compile", "gpu-gone"],
)  # fmt: skip
def test_fault_is_reported_at_its_step(
    tmp_path: Path,
    faults: dict[str, str],
    mode: str,
    extra_env: dict[str, str],
    step: str,
    words: str,
) -> None:
    root = _fault_dir(tmp_path, faults)
    env = {"PYTHONPATH": _child_pythonpath(root), "PATH": "/usr/bin:/bin", **extra_env}
    report = smoke.run_smoke(sys.executable, mode, env=env)
    assert not report.ok and report.failed is not None
    assert report.failed.name == step and words in (report.failed.error or ""), report.to_json()


# --- the install is undone when the smoke test fails --------------------------------------


@pytest.fixture(scope="module")
def template_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_venv(tmp_path_factory.mktemp("smoke-template") / "venv")


# A stand-in "torch" wheel makes the lock a torch row (the smoke test applies); the real
# torch the smoke child imports comes first on its path, the injected fault before it.
WHEELS = dict(
    [make_wheel("alpha-pkg", "1.0"), make_wheel("beta-pkg", "1.0", 64), make_wheel("torch", "1.0")]
)


def _lock(tmp_path: Path, target: str) -> Path:
    packages = tuple(
        LockedPackage(
            filename.split("-")[0].replace("_", "-"),
            "1.0",
            None,
            ("sha256:" + hashlib.sha256(data).hexdigest(),),
        )
        for filename, data in WHEELS.items()
    )
    lock = Lock(
        target=target,
        python=PY,
        packages=packages,
        kernel_wheel=None,
        env={},
        meta={"target": target, "python": PY},
    )
    path = tmp_path / f"{target}-lock.txt"
    path.write_text(format_lock(lock), encoding="utf-8")
    return path


@pytest.mark.slow
@pytest.mark.parametrize(
    ("faults", "target", "extra_env", "step"),
    [
        ({"torch/__init__.py": CRASHING_TORCH}, "cpu", {}, "torch"),
        ({"triton/__init__.py": BROKEN_TRITON, "triton/language.py": ""}, "cpu", {}, "triton"),
        ({}, "cuda", {"CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": ""}, "torch"),
    ],
    ids=["import-crash", "triton-cannot-compile", "gpu-gone"],
)
def test_failed_smoke_test_leaves_the_environment_byte_identical(
    template_venv: Path,
    tmp_path: Path,
    faults: dict[str, str],
    target: str,
    extra_env: dict[str, str],
    step: str,
) -> None:
    import os

    venv = copy_venv(template_venv, tmp_path / "venv")
    root = _fault_dir(tmp_path, faults)
    (tmp_path / "tmp").mkdir()
    before = snapshot(venv)
    with Index(WHEELS, {}) as index:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
        env.update(
            PIP_CONFIG_FILE=os.devnull,
            PIP_INDEX_URL=index.url,
            PIP_NO_CACHE_DIR="1",
            PIP_RETRIES="0",
            PIP_DISABLE_PIP_VERSION_CHECK="1",
            PYTHONPATH=_child_pythonpath(root),
            TMPDIR=str(tmp_path / "tmp"),
            GRETA_HASH_RECORD=str(tmp_path / "user-hashes.json"),
            GRETA_KERNEL_CACHE=str(tmp_path / "kernel-cache"),
            GRETA_KERNEL_INDEX="",
            **extra_env,
        )
        argv = [sys.executable, "-m", "greta", "install", "--lock", str(_lock(tmp_path, target)),
                "--python", python_of(venv), "--installer", "pip", "--force-target"]  # fmt: skip
        proc = subprocess.run(
            argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False
        )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"failed: smoke-test: smoke test step '{step}' failed" in proc.stderr, proc.stderr
    assert "doctor:" in proc.stderr and "fix:" in proc.stderr
    assert "put back as it was" in proc.stderr
    assert snapshot(venv) == before


@pytest.mark.gpu
def test_gpu_smoke_passes_on_the_gpu_machine() -> None:
    """On the GPU machine: every step on the device, and the first GRETA op call of a new
    process (kernel wheel installed and warmed, or JIT) reported beside a warm one."""
    import os

    env = {**os.environ, "PYTHONPATH": _child_pythonpath()}
    env.pop("TRITON_INTERPRET", None)
    report = smoke.run_smoke(sys.executable, "gpu", env=env)
    assert report.ok, report.to_json()
    timing = next(s.detail for s in report.steps if s.name == "greta-torch")
    assert timing["first_ms"] > 0 and timing["warm_ms"] > 0
    print(f"first call {timing['first_ms']:.2f} ms, warm {timing['warm_ms']:.3f} ms")
