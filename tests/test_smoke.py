"""The smoke test: proves an environment runs and computes right, and a failure undoes
the install.

The child runs isolated (`python -I`), so faults live in the environment under test, as
a broken install would (tests/_smoke_faults.py): a torch whose fake GPU (the CPU posing as
one) computes wrong matmuls, trains with wrong gradients, turns NaN after some steps or
has no kernel for the arch; a torch that cannot be imported; a Triton that cannot compile;
no GPU at all. The real `greta install` then runs against a fresh venv with tiny wheels
from a local index (the stand-in torch wheel is the faulty torch), and the venv must be
byte-identical afterwards, the message naming the failed step, the doctor check and the
fix.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _install_helpers import (
    PY,
    REPO,
    Index,
    copy_venv,
    make_wheel,
    pip_venv,
    python_of,
    snapshot,
)
from _smoke_faults import NAN_AFTER_STEPS, fake_torch, fault_env, mirror_env, package_wheel

from greta_install.install import smoke
from greta_install.install import smoke_child as CHILD
from greta_install.locks.lockfile import Lock, LockedPackage, format_lock

BROKEN_TRITON = """
__version__ = "0.0-broken"
def jit(fn=None, **kw):
    raise RuntimeError("triton: failed to compile: LLVM ERROR: no target for this GPU")
def cdiv(a, b):
    return -(-a // b)
"""
NO_GPU = {"CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": ""}


def _line(step: str, status: str, error: str | None = None, note: str | None = None) -> str:
    return json.dumps(
        {"step": step, "status": status, "seconds": 0.1, "detail": {}, "error": error, "note": note}
    )


def test_report_fails_closed_and_names_step_doctor_and_fix() -> None:
    out = "\n".join(
        [
            "Warning: something from a library",
            '{"plan": ["torch", "matmul", "triton"]}',
            _line("torch", "passed"),
            "{not json",
            _line("matmul", "skipped", note="no GPU (cpu mode)"),
            _line("triton", "failed", error="boom"),
            '{"no_step": 1}',
        ]
    )
    plan, steps = smoke.parse_output(out)
    assert plan == ["torch", "matmul", "triton"]
    assert [(s.name, s.status) for s in steps] == [
        ("torch", "passed"),
        ("matmul", "skipped"),
        ("triton", "failed"),
    ]
    report = smoke.SmokeReport("cpu", steps, returncode=1, planned=plan)
    assert not report.ok and report.failed is not None and report.failed.name == "triton"
    message = report.failure_message()
    assert "step 'triton' failed: boom" in message
    assert "doctor: triton.*" in message and "fix: greta doctor" in message
    assert report.to_json()["counts"] == {"passed": 1, "failed": 1, "skipped": 1}

    # A skipped step is no failure, but skips alone are no pass.
    assert smoke.SmokeReport("cpu", steps[:2], returncode=0, planned=plan[:2]).ok
    assert not smoke.SmokeReport("cpu", steps[1:2], returncode=0, planned=plan[1:2]).ok
    # Exit 0 without a plan, or with a planned step never reported, is not a pass.
    assert not smoke.SmokeReport("cpu", steps[:2], returncode=0).ok
    stopped = smoke.SmokeReport("cpu", steps[:2], returncode=0, planned=plan)
    assert not stopped.ok and stopped.missing == ["triton"]
    assert "crashed before step 'triton'" in stopped.failure_message()
    # An unknown status counts as a failure.
    assert smoke.parse_line(_line("jax", "maybe")).failed  # type: ignore[union-attr]


def test_a_missing_kernel_is_diagnosed_as_the_arch_whatever_the_step() -> None:
    error = "RuntimeError: HIP error: invalid device function"
    report = smoke.SmokeReport("gpu", [smoke.Step("torch", "failed", 0.1, None, error)], 1)
    message = report.failure_message()
    assert "doctor: torch.arch" in message and "carries this GPU's arch" in message
    numeric = smoke.SmokeReport("gpu", [smoke.Step("training", "failed", 0.1, None, "nan")], 1)
    assert "doctor: torch.arch" in numeric.failure_message()
    assert "wrong numbers" in numeric.failure_message()


def test_every_step_of_the_child_has_a_diagnosis() -> None:
    assert set(CHILD.STEPS) == set(smoke.DIAGNOSIS)
    assert set(CHILD.NUMERIC_STEPS) <= set(CHILD.STEPS)


def test_a_hanging_child_is_killed_and_reported(tmp_path: Path) -> None:
    python = fault_env(
        tmp_path / "env", "none", {"torch/__init__.py": "import time\ntime.sleep(600)\n"}
    )
    report = smoke.run_smoke(python, "cpu", timeout=1)
    assert report.timed_out and not report.ok
    assert "did not finish in time" in report.failure_message()


def test_the_child_runs_isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PYTHONPATH and the current directory do not reach the child: a torch planted in
    either is not the one it imports (here: the environment's torch is empty, so the
    torch step fails, and not with the planted torch's words)."""
    planted = tmp_path / "planted"
    (planted / "torch").mkdir(parents=True)
    (planted / "torch" / "__init__.py").write_text("raise SystemExit('planted torch ran')\n")
    python = fault_env(tmp_path / "env", "none", {"torch/__init__.py": ""})
    monkeypatch.chdir(planted)
    report = smoke.run_smoke(
        python, "cpu", env={"PYTHONPATH": str(planted), "PATH": "/usr/bin:/bin"}
    )
    torch_step = next(s for s in report.steps if s.name == "torch")
    assert torch_step.failed and "planted" not in (torch_step.error or "")


def _by_name(report: smoke.SmokeReport) -> dict[str, smoke.Step]:
    return {s.name: s for s in report.steps}


def test_the_gate_passes_on_the_real_cpu_stack(tmp_path: Path) -> None:
    """`greta smoke --json` on this interpreter's own torch, triton, jax and this GRETA
    (mirror_env: also where GRETA is not installed, as on the GPU machine): every step
    reported, none failed; the numeric checks ran on the CPU within their bounds but say
    they compared no GPU (skipped, not passed)."""
    python = mirror_env(tmp_path / "env")
    proc = subprocess.run(
        [sys.executable, "-m", "greta", "smoke", "--mode", "cpu", "--json", "--python", python],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["ok"], proc.stdout + proc.stderr
    steps = {s["step"]: s for s in report["steps"]}
    assert [s["step"] for s in report["steps"]] == list(CHILD.STEPS)
    for name in CHILD.NUMERIC_STEPS:
        assert steps[name]["status"] == "skipped" and "no GPU" in steps[name]["note"]
    for name in ("matmul", "chain", "training"):
        ratios = steps[name]["detail"]["max_err_over_bound"]
        values = ratios.values() if isinstance(ratios, dict) else [ratios]
        assert all(0 <= r < 1 for r in values), steps[name]
    loss = steps["training"]["detail"]["loss_cpu"]
    assert loss[1] < 0.5 * loss[0]
    for name in ("torch", "triton", "sdpa", "greta-raw", "greta-torch", "jax", "greta-jax"):
        assert steps[name]["status"] == "passed", steps[name]
    assert report["counts"] == {"passed": 7, "failed": 0, "skipped": 4}


@pytest.mark.slow
def test_a_fake_gpu_that_computes_right_passes_the_numeric_gate(tmp_path: Path) -> None:
    """The control for the faults below: the same fake GPU without a fault passes."""
    report = smoke.run_smoke(fault_env(tmp_path / "env", "none"), "gpu")
    steps = _by_name(report)
    for name in ("torch", *CHILD.NUMERIC_STEPS, "greta-torch"):
        assert steps[name].status == "passed", report.to_json()
    assert steps["training"].detail["max_err_over_bound"] < 1


def test_forward_right_training_wrong_is_caught(tmp_path: Path) -> None:
    """unslothai/unsloth#8412's pattern: the forward matches, the gradients do not."""
    report = smoke.run_smoke(fault_env(tmp_path / "env", "wrong-grad"), "gpu")
    steps = _by_name(report)
    assert steps["matmul"].status == "passed" and steps["chain"].status == "passed"
    assert steps["training"].failed and "diverged from the CPU" in (steps["training"].error or "")
    assert not report.ok and report.failed is not None and report.failed.name == "training"


@pytest.mark.slow
def test_bindings_not_installed_are_skipped_not_passed(tmp_path: Path) -> None:
    """An environment without GRETA: its binding checks say so, the rest still runs."""
    report = smoke.run_smoke(fault_env(tmp_path / "env", "no-gpu", with_greta=False), "cpu")
    steps = _by_name(report)
    for name in ("greta-raw", "greta-torch", "greta-jax"):
        assert steps[name].status == "skipped", report.to_json()
        assert steps[name].note == "greta_core is not installed in this environment"
    assert steps["torch"].status == "passed" and steps["triton"].status == "passed"
    assert report.ok


# --- the install is undone when the smoke test fails --------------------------------------


@pytest.fixture(scope="module")
def template_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pip_venv(tmp_path_factory, tmp_path_factory.mktemp("smoke-template") / "venv")


def _wheels(fault: str, triton: str | None) -> dict[str, bytes]:
    """The lock's files: two plain packages and the (faulty) torch, maybe a broken Triton."""
    wheels = [
        make_wheel("alpha-pkg", "1.0"),
        make_wheel("beta-pkg", "1.0", 64),
        package_wheel("torch", fake_torch(fault)),
    ]
    if triton is not None:
        wheels.append(package_wheel("triton", triton, {"language.py": ""}))
    return dict(wheels)


def _lock(tmp_path: Path, target: str, wheels: dict[str, bytes]) -> Path:
    packages = tuple(
        LockedPackage(
            filename.split("-")[0].replace("_", "-"),
            "1.0",
            None,
            ("sha256:" + hashlib.sha256(data).hexdigest(),),
        )
        for filename, data in wheels.items()
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


def _install_fails_and_is_undone(
    template: Path,
    tmp_path: Path,
    fault: str,
    target: str,
    extra_env: dict[str, str],
    triton: str | None = None,
) -> str:
    """Run `greta install` of a lock carrying the fault; returns its stderr after checking
    it failed in the smoke test and left the venv byte-identical."""
    venv = copy_venv(template, tmp_path / "venv")
    (tmp_path / "tmp").mkdir()
    wheels = _wheels(fault, triton)
    before = snapshot(venv)
    with Index(wheels, {}) as index:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
        env.update(
            PIP_CONFIG_FILE=os.devnull,
            PIP_INDEX_URL=index.url,
            PIP_NO_CACHE_DIR="1",
            PIP_RETRIES="0",
            PIP_DISABLE_PIP_VERSION_CHECK="1",
            TMPDIR=str(tmp_path / "tmp"),
            GRETA_HASH_RECORD=str(tmp_path / "user-hashes.json"),
            GRETA_KERNEL_CACHE=str(tmp_path / "kernel-cache"),
            GRETA_KERNEL_INDEX="",
            **extra_env,
        )
        argv = [sys.executable, "-m", "greta", "install", "--lock", str(_lock(tmp_path, target, wheels)),
                "--python", python_of(venv), "--installer", "pip", "--force-target"]  # fmt: skip
        proc = subprocess.run(
            argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False
        )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "put back as it was" in proc.stderr, proc.stderr
    assert snapshot(venv) == before
    return proc.stderr


WRONG_GPUS = [
    ("wrong-matmul", "matmul", "bfloat16 matmul (k=64)", "torch.arch"),
    ("nan-after", "training", f"at step {NAN_AFTER_STEPS} of", "torch.arch"),
    ("no-kernel", "torch", "HIP error: invalid device function", "torch.arch"),
]


@pytest.mark.parametrize(("fault", "step", "words", "doctor"), WRONG_GPUS[:2])
def test_a_gpu_that_computes_wrong_fails_the_smoke_test(
    tmp_path: Path, fault: str, step: str, words: str, doctor: str
) -> None:
    """Each wrong GPU is caught at its step, with the message the install prints; the
    install's undo on a smoke failure is the same whichever step failed (next test)."""
    report = smoke.run_smoke(fault_env(tmp_path / "env", fault), "gpu")
    message = report.failure_message()
    assert not report.ok and report.failed is not None and report.failed.name == step, message
    assert message.startswith(f"smoke test step '{step}' failed"), message
    assert words in message and f"doctor: {doctor}" in message and "fix: greta doctor" in message


@pytest.mark.parametrize(("fault", "step", "words", "doctor"), WRONG_GPUS[2:])
def test_a_gpu_that_computes_wrong_undoes_the_install(
    template_venv: Path, tmp_path: Path, fault: str, step: str, words: str, doctor: str
) -> None:
    stderr = _install_fails_and_is_undone(template_venv, tmp_path, fault, "cuda", {})
    assert f"failed: smoke-test: smoke test step '{step}' failed" in stderr, stderr
    assert words in stderr and f"doctor: {doctor}" in stderr and "fix: greta doctor" in stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fault", "target", "extra_env", "triton", "step", "words"),
    [
        ("crash", "cpu", {}, None, "torch", "libtorch_cpu.so"),
        ("none", "cpu", {}, BROKEN_TRITON, "triton", "failed to compile"),
        ("no-gpu", "cuda", NO_GPU, None, "torch", "sees no GPU"),
    ],
    ids=["import-crash", "triton-cannot-compile", "gpu-gone"],
)  # fmt: skip
def test_a_broken_stack_undoes_the_install(
    template_venv: Path,
    tmp_path: Path,
    fault: str,
    target: str,
    extra_env: dict[str, str],
    triton: str | None,
    step: str,
    words: str,
) -> None:
    stderr = _install_fails_and_is_undone(template_venv, tmp_path, fault, target, extra_env, triton)
    assert f"failed: smoke-test: smoke test step '{step}' failed" in stderr, stderr
    assert words in stderr and "doctor:" in stderr and "fix:" in stderr


@pytest.mark.gpu
def test_gpu_smoke_passes_on_the_gpu_machine(tmp_path: Path) -> None:
    """On the GPU machine, its own torch/triton/jax with this GRETA (an environment that
    adds this checkout to them): every step on the device, the numeric gate against the
    CPU included, and the first GRETA op call of a new process beside a warm one."""
    report = smoke.run_smoke(mirror_env(tmp_path / "env"), "gpu")
    assert report.ok, report.to_json()
    steps = _by_name(report)
    for name in (
        "torch",
        *CHILD.NUMERIC_STEPS,
        "triton",
        "sdpa",
        "greta-raw",
        "greta-torch",
        "jax",
    ):
        assert steps[name].status == "passed", report.to_json()
    assert steps["torch"].detail["compute"].startswith("cuda")
    timing = steps["greta-torch"].detail
    assert timing["first_ms"] > 0 and timing["warm_ms"] > 0
    print(f"first call {timing['first_ms']:.2f} ms, warm {timing['warm_ms']:.3f} ms")
