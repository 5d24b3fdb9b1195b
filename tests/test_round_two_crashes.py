"""Crashes and slow paths of issue 30 (item 7), each from its repro, with variants.

`greta snapshot` with any ROCM_PATH; detection bounded on a garbage snapshot (1000 KFD
nodes with 100 MB sparse `properties` files, a 100k-row nvidia-smi.txt) by caps on file
size and device count, not by timing; a nested env.json; the tracebacks the issue listed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from _install_helpers import REPO
from conftest import SNAPSHOTS

from greta_install.detection import evidence, system_view
from greta_install.detection.detect import detect
from greta_install.detection.snapshot import write_snapshot
from greta_install.detection.system_view import LiveSystem, SnapshotSystem

ROCM_PATHS = [
    "/opt/rocm-6.4.1", "/opt/rocm-6.4.1/", "/opt/rocm", "/nonexistent/rocm", "rocm-relative",
    "/", "/opt/rocm-\x01ctl", "/opt/" + "r" * 5000, "/opt/rocm-link",
]  # fmt: skip


@pytest.mark.parametrize("rocm_path", ROCM_PATHS)
def test_snapshot_works_with_any_rocm_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rocm_path: str
) -> None:
    """`greta snapshot` raised TypeError (str / str) whenever ROCM_PATH was not /opt/rocm."""
    machine = tmp_path / "machine"
    (machine / "opt" / "rocm-6.4.1" / ".info").mkdir(parents=True)
    (machine / "opt" / "rocm-6.4.1" / ".info" / "version").write_text("6.4.1-120\n")
    (machine / "opt" / "rocm-link").symlink_to("/etc")  # a link out of the allowed places
    monkeypatch.setenv("ROCM_PATH", rocm_path)
    monkeypatch.setattr(system_view.LiveSystem, "run", lambda self, tool: None)
    files = write_snapshot(LiveSystem(str(machine)), tmp_path / "snap")
    env = json.loads((tmp_path / "snap" / "env.json").read_text())
    assert env["ROCM_PATH"] == rocm_path and "meta.json" in files
    copied = tmp_path / "snap" / "opt" / "rocm-6.4.1" / ".info" / "version"
    assert copied.is_file() == rocm_path.startswith("/opt/rocm-6.4.1")
    assert not (tmp_path / "snap" / "opt" / "rocm-link").exists()
    assert not list(machine.rglob("env.json"))  # nothing written into the machine's tree


def test_snapshot_command_with_an_unusual_rocm_path(tmp_path: Path) -> None:
    env = {**os.environ, "ROCM_PATH": "/opt/rocm-6.4.1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "greta", "snapshot", str(tmp_path / "snap")],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "snapshot written to" in proc.stdout


def _kfd_garbage(root: Path, nodes: int, size: int) -> None:
    base = root / "sys" / "class" / "kfd" / "kfd" / "topology" / "nodes"
    for i in range(nodes):
        (base / str(i)).mkdir(parents=True)
        with open(base / str(i) / "properties", "wb") as fh:
            fh.truncate(size)  # sparse: no disk used
        (base / str(i) / "gpu_id").write_text("1\n")


def test_detection_reads_a_bounded_share_of_garbage_kfd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1000 KFD nodes of 100 MB sparse `properties` files: at most MAX_DEVICES nodes are
    read, each at most KERNEL_FILE_MAX_BYTES (counted, not timed)."""
    _kfd_garbage(tmp_path, 1000, 100 * 1024 * 1024)
    read: list[int] = []
    real = system_view.read_bytes

    def counting(path: object, cap: int, **kw: bool) -> bytes:
        data = real(path, cap, **kw)  # type: ignore[arg-type]
        read.append(len(data))
        return data

    monkeypatch.setattr(system_view, "read_bytes", counting)
    result = detect(SnapshotSystem(tmp_path))
    assert result.target == "cpu"
    assert max(read) <= system_view.KERNEL_FILE_MAX_BYTES
    assert len([n for n in read if n > 100]) <= evidence.MAX_DEVICES


def test_detection_caps_a_huge_nvidia_smi_table(tmp_path: Path) -> None:
    rows = [
        f"{i}, NVIDIA H100 80GB HBM3, 00000000:{i % 256:02X}:00.0, 0x233010DE, 9.0, 565.57.01, 81559 MiB"
        for i in range(100_000)
    ]
    (tmp_path / "nvidia-smi.txt").write_text("\n".join(rows) + "\n")
    ev = evidence.gather(SnapshotSystem(tmp_path))
    assert 0 < len(ev.nvidia_smi) <= evidence.MAX_DEVICES
    assert any("only the first" in p for p in ev.problems["nvidia-smi"])
    assert detect(SnapshotSystem(tmp_path)).target == "cuda"


@pytest.mark.parametrize(
    "content",
    ["[" * 100_000 + "]" * 100_000, json.dumps({"ROCM_PATH": {"a": [1] * 10}}),
     '{"HSA_OVERRIDE_GFX_VERSION": ' + "[" * 50_000 + "]" * 50_000 + "}", "[]", "nul\0"],
)  # fmt: skip
def test_a_nested_env_json_does_not_change_detection(tmp_path: Path, content: str) -> None:
    """A deeply nested env.json in a gfx90a snapshot turned it into the cpu target."""
    snap = tmp_path / "snap"
    shutil.copytree(SNAPSHOTS / "mi210-kfd", snap)
    expected = detect(SnapshotSystem(snap))
    (snap / "env.json").write_text(content)
    assert SnapshotSystem(snap).env() == {}
    got = detect(SnapshotSystem(snap))
    assert (got.target, got.arch) == (expected.target, expected.arch) == ("instinct", "gfx90a")


# --- tracebacks the issue listed --------------------------------------------------------


def _greta(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "greta", *args], cwd=REPO, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300, check=False,
    )  # fmt: skip


def _venv(path: Path) -> tuple[str, Path]:
    venv.EnvBuilder(with_pip=False, symlinks=True).create(path)
    python = str(path / "bin" / "python")
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    return python, Path(site)


@pytest.mark.parametrize("command", [("env", "--clear"), ("uninstall",)])
def test_env_clear_and_uninstall_with_a_folder_for_the_env_file(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    python, site = _venv(tmp_path / "venv")
    (site / "greta-env.json").mkdir()
    (site / "greta-env.json" / "user-data").write_text("keep")
    proc = _greta(*command, "--python", python)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "is a folder" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert (site / "greta-env.json" / "user-data").read_text() == "keep"


@pytest.mark.parametrize("output", ["/a\\0b", "\\0", "3.11\\0"])
def test_an_interpreter_that_prints_nul_bytes(tmp_path: Path, output: str) -> None:
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\nprintf '{output}\\n'\n")
    fake.chmod(0o755)
    for command in (("env",), ("uninstall", "--dry-run"), ("install", "--dry-run")):
        proc = _greta(*command, "--python", str(fake))
        assert proc.returncode == 2, (command, proc.stderr)
        assert "Traceback" not in proc.stderr and str(fake) in proc.stderr
