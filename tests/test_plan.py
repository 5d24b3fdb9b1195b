"""Install plans (dry-run): complete and self-consistent for every target, from any machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from greta_install.installer import find_kernel_wheel
from greta_install.lockfile import load_lock
from greta_install.matrix import load_matrix
from greta_install.model import Detection, Gpu
from greta_install.plan import JIT_NOTE, PlanError, build_plan, choose_target

REPO = Path(__file__).resolve().parent.parent
TRITONS = {"triton", "triton-rocm", "pytorch-triton-rocm"}


@pytest.fixture(scope="module")
def matrix():
    return load_matrix()


def plan_for(matrix, target: str, python: str = "3.12", **kwargs):
    return build_plan(
        matrix, load_lock(target, python), python_executable="/env/bin/python", **kwargs
    )


def check_consistent(data: dict, torch_local: str, torch_index: str) -> None:
    pkgs = {p["name"]: p for p in data["packages"]}
    torch = pkgs["torch"]
    assert Version(torch["version"]).local == torch_local
    assert torch["index"] == torch_index
    assert len(TRITONS & set(pkgs)) == 1
    jax = pkgs["jax"]["version"]
    assert pkgs["jaxlib"]["version"] == jax
    for name, pkg in pkgs.items():
        if name.startswith("jax-") and (name.endswith("-plugin") or name.endswith("-pjrt")):
            assert pkg["version"] == jax, name
        if pkg["index"] == "default":
            assert pkg["hash"] == "verified" and pkg["hashes"], name
        assert pkg["hash"] in ("verified", "unverified")
    assert set(data["unverified"]) == {n for n, p in pkgs.items() if p["hash"] == "unverified"}
    assert data["ready"] is (not data["unverified"] or data["allow_unverified"])


def test_mi300x_plan(matrix) -> None:
    plan = plan_for(matrix, "mi300x")
    data = plan.to_json()
    check_consistent(data, "rocm7.2", "https://download.pytorch.org/whl/rocm7.2")
    pkgs = {p["name"]: p for p in data["packages"]}
    assert pkgs["triton-rocm"]["version"] == "3.6.0" and "triton" not in pkgs
    assert {"jax-rocm7-plugin", "jax-rocm7-pjrt"} <= set(pkgs)
    assert data["kernel_wheel"]["requirement"] == "greta-kernels-gfx942==0.1.0"
    assert data["kernel_wheel"]["status"] == "not-available"
    assert any(JIT_NOTE in w for w in data["warnings"])
    assert data["env"]["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert "HSA_OVERRIDE_GFX_VERSION" not in data["env"]
    # torch and triton-rocm come from an unreachable vendor index: not installable silently.
    assert set(data["unverified"]) == {"torch", "triton-rocm"}
    assert data["ready"] is False
    assert plan_for(matrix, "mi300x", allow_unverified=True).to_json()["ready"] is True


def test_radeon_gfx1103_uses_the_override_and_the_gfx1100_wheel(matrix) -> None:
    data = plan_for(matrix, "radeon", arch="gfx1103").to_json()
    check_consistent(data, "rocm7.2", "https://download.pytorch.org/whl/rocm7.2")
    assert data["arch"] == "gfx1103" and data["kernel_arch"] == "gfx1100"
    assert data["env"]["HSA_OVERRIDE_GFX_VERSION"] == "11.0.0"
    assert data["kernel_wheel"]["requirement"] == "greta-kernels-gfx1100==0.1.0"
    assert any("hang" in w for w in data["warnings"])
    assert any("greta-kernels-gfx1100 because" in w for w in data["warnings"])


def test_radeon_gfx1103_from_detection(matrix) -> None:
    apu = Gpu(
        vendor="amd", arch="gfx1103", product="AMD Radeon 780M", pci_id="0x15bf", integrated=True
    )
    detection = Detection(
        target="radeon", primary=0, gpus=[apu], env_seen={"HSA_OVERRIDE_GFX_VERSION": "10.3.0"}
    )
    data = plan_for(matrix, "radeon", detection=detection).to_json()
    assert data["detected"] is True and data["arch"] == "gfx1103"
    assert data["env"]["HSA_OVERRIDE_GFX_VERSION"] == "11.0.0"
    assert any("already set in your environment" in w for w in data["warnings"])


def test_supported_radeon_arch_needs_no_override(matrix) -> None:
    data = plan_for(matrix, "radeon", arch="gfx1201").to_json()
    assert "HSA_OVERRIDE_GFX_VERSION" not in data["env"]
    assert data["kernel_wheel"]["requirement"] == "greta-kernels-gfx1201==0.1.0"


def test_cuda_plan(matrix) -> None:
    data = plan_for(matrix, "cuda").to_json()
    check_consistent(data, "cu130", "https://download.pytorch.org/whl/cu130")
    pkgs = {p["name"]: p["version"] for p in data["packages"]}
    assert (
        pkgs["triton"] == "3.6.0"
        and pkgs["jax-cuda13-plugin"] == "0.11.2"
        and pkgs["jax-triton"] == "0.3.1"
    )
    assert data["kernel_wheel"]["requirement"] == "greta-kernels-sm-90==0.1.0"
    assert data["unverified"] == ["torch"]


def test_cpu_plan_py311_is_ready_here(matrix) -> None:
    data = plan_for(matrix, "cpu", python="3.11").to_json()
    check_consistent(data, "cpu", "https://download.pytorch.org/whl/cpu")
    assert data["ready"] is True and data["unverified"] == []
    assert data["kernel_wheel"]["status"] == "none"
    assert data["env"] == {"JAX_PLATFORMS": "cpu", "TRITON_INTERPRET": "1"}
    assert "jax-triton" not in {p["name"] for p in data["packages"]}
    # One download per package, then one offline install from the verified files.
    assert len(data["commands"]["stage"]) == len(data["packages"])
    install = data["commands"]["install"]
    assert {"--no-index", "--no-deps", "--require-hashes"} <= set(install)


def test_plan_json_schema(matrix) -> None:
    data = json.loads(json.dumps(plan_for(matrix, "mi300x").to_json()))
    assert set(data) >= {
        "schema",
        "target",
        "arch",
        "kernel_arch",
        "python",
        "installer",
        "lock",
        "packages",
        "unverified",
        "kernel_wheel",
        "env",
        "env_why",
        "warnings",
        "blockers",
        "ready",
        "commands",
    }
    assert set(data["packages"][0]) == {"name", "version", "index", "hash", "hashes", "role"}
    assert set(data["kernel_wheel"]) == {
        "requirement",
        "arch",
        "status",
        "location",
        "sha256",
        "pinned",
        "note",
    }
    assert set(data["env_why"]) == set(data["env"])


def test_kernel_wheel_found_in_a_directory(matrix, tmp_path: Path) -> None:
    wheel = tmp_path / "greta_kernels_gfx942-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"not really a wheel")
    (tmp_path / "SHA256SUMS").write_text(f"{'f' * 64}  {wheel.name}\n")
    lookup = find_kernel_wheel(str(tmp_path), "greta-kernels-gfx942==0.1.0")
    # SHA256SUMS comes from where the wheel comes from: without a hash in the lock the
    # wheel is skipped (JIT) unless the user accepts it unverified.
    unpinned = plan_for(matrix, "mi300x", kernel=lookup).to_json()
    assert unpinned["kernel_wheel"]["status"] == "not-available"
    assert "pins no hash" in unpinned["kernel_wheel"]["note"]
    data = plan_for(matrix, "mi300x", kernel=lookup, allow_unverified=True).to_json()
    assert data["kernel_wheel"]["status"] == "found"
    assert data["kernel_wheel"]["location"] == str(wheel)
    assert data["kernel_wheel"]["sha256"] == "f" * 64
    assert not any(JIT_NOTE in w for w in data["warnings"])
    missing = find_kernel_wheel(str(tmp_path), "greta-kernels-gfx1100==0.1.0")
    assert missing.location is None and "not in" in (missing.problem or "")


def test_bad_requests(matrix) -> None:
    with pytest.raises(PlanError, match="does not belong to target radeon"):
        plan_for(matrix, "radeon", arch="gfx942")
    with pytest.raises(PlanError, match="unknown target"):
        choose_target("tpu", None, matrix)
    with pytest.raises(PlanError, match="pass --target"):
        choose_target(None, None, matrix)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "greta", "install", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "torch_local"),
    [
        (("--target", "mi300x"), "rocm7.2"),
        (("--target", "radeon", "--arch", "gfx1103"), "rocm7.2"),
        (("--target", "cuda"), "cu130"),
        (("--target", "cpu"), "cpu"),
    ],
)
def test_cli_dry_run_json(args: tuple[str, ...], torch_local: str) -> None:
    proc = run_cli("--dry-run", "--json", "--python", "3.12", *args)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["python"]["version"] == "3.12"
    check_consistent(data, torch_local, f"https://download.pytorch.org/whl/{torch_local}")


def test_cli_errors_are_messages_not_tracebacks() -> None:
    proc = run_cli("--dry-run", "--target", "tpu", "--python", "3.12")
    assert (
        proc.returncode == 2 and "unknown target" in proc.stderr and "Traceback" not in proc.stderr
    )
    proc = run_cli("--dry-run", "--target", "cpu", "--python", "3.9")
    assert proc.returncode == 2 and "no lock for target 'cpu' on Python 3.9" in proc.stderr
    proc = run_cli("--target", "cpu", "--python", "3.12")
    assert proc.returncode == 2 and "needs --python PATH" in proc.stderr
