"""`greta doctor` end to end: on this machine, on every shared snapshot, and with a probe
that hangs or crashes."""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import SNAPSHOTS, snapshot_names

from greta import cli
from greta.cli import build_parser
from greta_install.commands import doctor as doctor_command
from greta_install.detection.system_view import LiveSystem
from greta_install.doctor import collect
from greta_install.doctor.runner import run_checks

ROOT = Path(__file__).resolve().parent.parent
STATUSES = {"ok", "warn", "fail", "skip"}
FRAMEWORK_CHECKS = (
    "torch.import",
    "torch.gpu",
    "numpy.torch",
    "triton.providers",
    "jax.versions",
    "lock.installed",
)


def greta(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "greta", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


def greta_here(*args: str) -> subprocess.CompletedProcess[str]:
    """`greta ARGS` through the CLI's entry point in this process, for the snapshot reports
    (no probes, no children: a child each cost ~0.5 CPU-s, 41 of them)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(args))
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def assert_valid_report(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.returncode in (0, 1), proc.stderr
    assert "Traceback" not in proc.stderr
    report = json.loads(proc.stdout)
    checks = report["checks"]
    assert checks, "no checks ran"
    for c in checks:
        assert set(c) >= {"id", "title", "status", "finding", "fix", "details"}
        assert c["status"] in STATUSES
        assert c["finding"]
        if c["status"] in ("warn", "fail"):
            assert c["fix"], c["id"]
        assert not c["details"].get("internal_error"), (c["id"], c["finding"])
    failed = any(c["status"] == "fail" for c in checks)
    assert proc.returncode == (1 if failed else 0)
    assert report["summary"]["exit_code"] == proc.returncode
    assert sum(report["summary"][s] for s in STATUSES) == len(checks)
    return report


def by_id(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in report["checks"]}


def test_live_json_report() -> None:
    report = assert_valid_report(greta("doctor", "--json"))
    assert report["mode"] == "live"
    checks = by_id(report)
    # The probe really ran torch in a child process (the suite's environment has it) ...
    assert checks["torch.import"]["status"] == "ok", checks["torch.import"]
    reported = checks["torch.import"]["details"]["version"]  # torch.__version__: 2.11.0+cu130
    assert reported.split("+")[0] == importlib.metadata.version("torch").split("+")[0]
    # ... and this Python is one the locks cover (3.11 or 3.12).
    assert checks["python.version"]["status"] == "ok", checks["python.version"]


def test_live_human_report_lists_fixes() -> None:
    proc = greta("doctor", "-v", "--target", "cpu")
    assert proc.returncode in (0, 1), proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "greta doctor: this machine, target cpu (from --target)"
    assert any(line.split()[1:2] == ["torch.import"] for line in lines if line.strip())
    for i, line in enumerate(lines):
        if line.strip().startswith(("WARN", "FAIL")):
            assert lines[i + 1].strip().startswith("fix: "), line
    assert lines[-1].endswith("skip")  # -v lists everything, so no hint about hidden checks


@pytest.mark.parametrize("name", snapshot_names())
def test_snapshot_never_crashes(name: str) -> None:
    report = assert_valid_report(
        greta_here("doctor", "--json", "--snapshot", str(SNAPSHOTS / name))
    )
    assert report["mode"] == "snapshot"
    checks = by_id(report)
    for check_id in FRAMEWORK_CHECKS:
        assert checks[check_id]["status"] == "skip"
        assert "snapshot" in checks[check_id]["finding"]


def test_pf_host_snapshot_says_compute_unusable() -> None:
    proc = greta_here("doctor", "--json", "--snapshot", str(SNAPSHOTS / "mi300x-pf-host"))
    sriov = by_id(assert_valid_report(proc))["gpu.sriov"]
    assert sriov["status"] == "fail"
    assert "not usable" in sriov["finding"]
    assert proc.returncode == 1


def test_missing_snapshot_is_a_clear_error(tmp_path: Path) -> None:
    proc = greta("doctor", "--snapshot", str(tmp_path / "nope"))
    assert proc.returncode == 2
    assert "snapshot directory not found" in proc.stderr
    assert "Traceback" not in proc.stderr


# --- probes that misbehave --------------------------------------------------------------

HANG = "import time; time.sleep(120)"
SEGFAULT = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
GARBAGE = "print('GRETA_PROBE_JSON:{not json')"


def fake_probe(code: str) -> Any:
    return lambda section: [sys.executable, "-c", code]


@pytest.mark.parametrize(
    ("code", "outcome", "words"),
    [
        (HANG, "timeout", "did not finish within 1 s"),
        (SEGFAULT, "crashed", "SIGSEGV"),
        (GARBAGE, "garbled", "without printing"),
    ],
)
def test_misbehaving_probe_is_a_finding(code: str, outcome: str, words: str) -> None:
    facts = collect.collect_facts(
        LiveSystem(), target="cpu", probe_timeout_s=1, probe_command=fake_probe(code)
    )
    assert facts.torch_probe is not None and facts.torch_probe.outcome == outcome
    checks = {r.id: r for r in run_checks(facts)}
    assert checks["torch.import"].status == "fail"
    assert words in checks["torch.import"].finding
    assert checks["torch.import"].fix
    assert checks["torch.gpu"].status == "skip"


def test_command_with_hanging_probe_reports_instead_of_crashing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(collect, "probe_argv", fake_probe(HANG))
    args = build_parser().parse_args(
        ["doctor", "--json", "--target", "cpu", "--probe-timeout", "1"]
    )
    code = doctor_command.run(args)
    report = json.loads(capsys.readouterr().out)
    checks = by_id(report)
    assert checks["torch.import"]["status"] == "fail"
    assert code == 1 == report["summary"]["exit_code"]


def test_command_survives_an_internal_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def explode(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("collector exploded")

    monkeypatch.setattr(collect, "collect_facts", explode)
    args = build_parser().parse_args(["doctor", "--json"])
    assert doctor_command.run(args) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["checks"][0]["id"] == "doctor.internal"
    assert "collector exploded" in report["checks"][0]["finding"]


@pytest.mark.gpu
def test_real_gpu_is_seen_by_torch() -> None:
    checks = by_id(assert_valid_report(greta("doctor", "--json")))
    assert checks["torch.import"]["status"] == "ok"
    assert checks["torch.build"]["status"] == "ok", checks["torch.build"]["finding"]
    assert checks["torch.gpu"]["status"] == "ok", checks["torch.gpu"]["finding"]
    assert checks["torch.gpu"]["details"]["count"] >= 1


def test_reader_closing_the_pipe_is_not_a_crash() -> None:
    # `greta doctor | head -0`: the reader is gone before the report is written. Its read
    # end is closed before the child starts, so the report's first write always meets a
    # pipe without a reader. The report is written by one function whatever the mode: a
    # snapshot's (no framework probes) stands for the live one.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "greta", "doctor", "-v", "--target", "cpu", "--snapshot",
             str(SNAPSHOTS / "mi300x-pf-host")],
            cwd=ROOT, env=env, stdout=write_end, stderr=subprocess.PIPE, timeout=600,
        )  # fmt: skip
    finally:
        os.close(write_end)
    stderr = proc.stderr.decode()
    assert proc.returncode in (0, 1), stderr
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr
