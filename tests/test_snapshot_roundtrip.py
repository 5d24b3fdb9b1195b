"""`greta snapshot` from a fake live machine, then `greta detect` from the snapshot."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SNAPSHOTS

from greta_install.detection.detect import detect
from greta_install.detection.snapshot import redact, write_snapshot
from greta_install.detection.system_view import LiveSystem, SnapshotSystem

ROOT = Path(__file__).resolve().parents[1]
NODES = "sys/class/kfd/kfd/topology/nodes"


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _fake_tool(bindir: Path, name: str, output_file: Path) -> None:
    script = bindir / name
    script.write_text(f"#!/bin/sh\ncat '{output_file}'\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def fake_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Radeon RX 6700 XT box: KFD + DRM sysfs, lspci and rocminfo on PATH, ROCm 6.4."""
    root = tmp_path / "root"
    _write(root, f"{NODES}/0/properties", "cpu_cores_count 8\nsimd_count 0\n")
    props = (
        "simd_count 80\nsimd_per_cu 2\ngfx_target_version 100301\nvendor_id 4098\n"
        "device_id 29663\nlocation_id 768\ndomain 0\nunique_id 1234567890\n"
    )
    _write(root, f"{NODES}/1/properties", props)
    _write(root, f"{NODES}/1/name", "gfx1031\n")
    _write(root, f"{NODES}/1/gpu_id", "4242\n")
    dev = "sys/class/drm/card0/device"
    _write(root, f"{dev}/vendor", "0x1002\n")
    _write(root, f"{dev}/device", "0x73df\n")
    _write(root, f"{dev}/revision", "0xc1\n")
    _write(root, f"{dev}/mem_info_vram_total", str(12 * 2**30) + "\n")
    _write(root, f"{dev}/uevent", "DRIVER=amdgpu\nPCI_SLOT_NAME=0000:03:00.0\n")
    _write(root, f"{dev}/secret_file", "must not be copied\n")
    _write(root, "sys/class/drm/card0-DP-1/status", "connected\n")
    _write(root, "opt/rocm/.info/version", "6.4.1-120\n")
    _write(root, "etc/passwd", "root:x:0:0\n")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    _fake_tool(bindir, "rocminfo", SNAPSHOTS / "rx6700xt-override" / "rocminfo.txt")
    lspci_out = tmp_path / "lspci.out"
    lspci_out.write_text(
        "0000:03:00.0 VGA compatible controller [0300]: Advanced Micro Devices, Inc. [AMD/ATI] "
        "Navi 22 [Radeon RX 6700/6700 XT/6750 XT / 6800M/6850M XT] [1002:73df] (rev c1)\n"
        "\tKernel driver in use: amdgpu\n"
    )
    _fake_tool(bindir, "lspci", lspci_out)
    # amdgpu's device node, which live detection asks (may this user open it?)
    (root / "dev").mkdir(exist_ok=True)
    (root / "dev" / "kfd").write_text("")
    # This box has no NVIDIA driver: shadow a real nvidia-smi (the GPU test machine has one).
    for missing in ("nvidia-smi", "amd-smi"):
        absent = bindir / missing
        absent.write_text("#!/bin/sh\nexit 127\n")
        absent.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("HSA_OVERRIDE_GFX_VERSION", "10.3.0")
    monkeypatch.setenv("SOME_SECRET_TOKEN", "do-not-copy")
    return root


def test_snapshot_roundtrip_detects_the_same(fake_machine: Path, tmp_path: Path) -> None:
    live = LiveSystem(root=str(fake_machine))
    live_det = detect(live, tools="all")
    out = tmp_path / "snap"
    files = write_snapshot(live, out)
    snap_det = detect(SnapshotSystem(out))

    assert live_det.arch == "gfx1031" and live_det.target == "radeon"
    # The override is the install plan's decision (it depends on the row's wheels); detection
    # reports the variable as seen and the arch's sibling in a note.
    assert live_det.env == {} and live_det.env_seen == {"HSA_OVERRIDE_GFX_VERSION": "10.3.0"}
    assert any("HSA_OVERRIDE_GFX_VERSION=10.3.0" in w for w in live_det.warnings)
    assert live_det.gpus[0].evidence == ("kfd", "drm", "rocminfo", "lspci")
    assert live_det.rocm_version == "6.4.1"
    live_json, snap_json = live_det.to_json(), snap_det.to_json()
    assert snap_json == live_json

    assert "rocminfo.txt" in files and "lspci.txt" in files
    assert f"{NODES}/1/properties" in files and f"{NODES}/1/name" in files
    assert json.loads((out / "env.json").read_text()) == {"HSA_OVERRIDE_GFX_VERSION": "10.3.0"}
    meta = json.loads((out / "meta.json").read_text())
    assert meta["greta_version"] and meta["date"] and meta["platform"]


def test_snapshot_copies_nothing_else(fake_machine: Path, tmp_path: Path) -> None:
    out = tmp_path / "snap"
    write_snapshot(LiveSystem(root=str(fake_machine)), out)
    every = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert not any("secret" in p or "passwd" in p or "card0-DP-1" in p for p in every)
    assert "do-not-copy" not in (out / "env.json").read_text()
    props = (out / NODES / "1" / "properties").read_text()
    assert "unique_id REDACTED" in props and "1234567890" not in props


def test_redact() -> None:
    text = "    Serial Number : 1654423001593\n    GPU UUID : GPU-b42d\nGPU[0]\t\t: Unique ID: 0x8d14\n"
    out = redact(text)
    assert "1654423001593" not in out and "GPU-b42d" not in out and "0x8d14" not in out
    assert "Serial Number : REDACTED" in out
    assert redact("Product Name : NVIDIA H100\n") == "Product Name : NVIDIA H100\n"


def test_existing_snapshot_dir_is_refused(fake_machine: Path, tmp_path: Path) -> None:
    out = tmp_path / "snap"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        write_snapshot(LiveSystem(root=str(fake_machine)), out)
    assert (out / "keep.txt").read_text() == "mine"


def test_failed_snapshot_leaves_nothing(fake_machine: Path, tmp_path: Path) -> None:
    class Exploding(LiveSystem):
        def read_text(self, path: str) -> str | None:
            if path.endswith("/device"):
                raise OSError("disk on fire")
            return super().read_text(path)

    parent = tmp_path / "out"
    parent.mkdir()
    with pytest.raises(OSError):
        write_snapshot(Exploding(root=str(fake_machine)), parent / "snap")
    assert list(parent.iterdir()) == []


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    code = (
        "import json, sys, contextlib, io\n"
        "from greta.cli import main\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf):\n"
        f"    rc = main({list(args)!r})\n"
        "heavy = sorted(m for m in ('torch', 'jax', 'jaxlib', 'numpy', 'triton') if m in sys.modules)\n"
        "print(json.dumps({'rc': rc, 'out': buf.getvalue(), 'heavy': heavy}))\n"
    )
    run_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=run_env,
        check=False,
    )


def test_cli_detect_json_imports_no_framework() -> None:
    proc = _cli("detect", "--json", "--snapshot", str(SNAPSHOTS / "mi300x-x4"))
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["rc"] == 0 and result["heavy"] == []
    data = json.loads(result["out"])
    assert data["target"] == "mi300x" and data["arch"] == "gfx942" and len(data["gpus"]) == 4
    live = json.loads(json.loads(_cli("detect", "--json").stdout.strip().splitlines()[-1])["out"])
    # The machines this suite runs on: CI's CPU machine and the lent NVIDIA GPU.
    if Path("/dev/kfd").exists():
        assert live["target"] in ("mi300x", "radeon", "instinct")
    elif shutil.which("nvidia-smi"):
        assert live["target"] == "cuda"
    else:
        assert live["target"] == "cpu"


def test_cli_human_output_and_missing_snapshot() -> None:
    proc = _cli("detect", "--snapshot", str(SNAPSHOTS / "rx6700xt-override"))
    out = json.loads(proc.stdout.strip().splitlines()[-1])["out"]
    assert (
        "target: radeon" in out and "runs gfx1030 code via HSA_OVERRIDE_GFX_VERSION=10.3.0" in out
    )
    missing = subprocess.run(
        [sys.executable, "-m", "greta", "detect", "--snapshot", "/nonexistent/snap"],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False,
    )  # fmt: skip
    assert missing.returncode == 2
    assert "snapshot directory not found" in missing.stderr and "Traceback" not in missing.stderr
