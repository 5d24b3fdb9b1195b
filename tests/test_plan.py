"""Install plans (dry-run): complete and self-consistent for every target, from any machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from greta_install.install.installer import find_kernel_wheel
from greta_install.locks.lockfile import load_lock
from greta_install.locks.matrix import load_matrix
from greta_install.model import Detection, Gpu
from greta_install.plan.install_plan import JIT_NOTE, PlanError, build_plan, choose_target

REPO = Path(__file__).resolve().parent.parent
TRITONS = {"triton", "triton-rocm", "pytorch-triton-rocm"}


@pytest.fixture(scope="module")
def matrix():
    return load_matrix()


def plan_for(matrix, target: str, python: str = "3.12", **kwargs):
    return build_plan(
        matrix, load_lock(target, python), python_executable="/env/bin/python", **kwargs
    )


def check_consistent(data: dict, torch_local: str | None, torch_index: str) -> None:
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
        assert pkg["hash"] in ("verified", "recorded", "trust-on-first-use")
    assert set(data["trust_on_first_use"]) == {
        n for n, p in pkgs.items() if p["hash"] == "trust-on-first-use"
    }
    # Trust on first use is the default policy: nothing blocks unless --strict.
    assert data["ready"] is (data["hash_policy"] != "strict" or not data["trust_on_first_use"])
    # Every vendor download is listed in the plan and in its commands.
    vendor = {p["name"] for p in data["packages"] if p["index"] != "default"}
    assert {v["name"] for v in data["vendor_downloads"]} == vendor
    assert len(data["commands"]["stage"]) == len(data["packages"])


ROCM714 = "https://download.pytorch.org/whl/rocm7.14"
ROCM72 = "https://download.pytorch.org/whl/rocm7.2"


def test_mi300x_plan(matrix) -> None:
    plan = plan_for(matrix, "mi300x")
    data = plan.to_json()
    check_consistent(data, "rocm7.14", ROCM714)
    pkgs = {p["name"]: p for p in data["packages"]}
    assert pkgs["torch"]["version"] == "2.14.1+rocm7.14"
    assert pkgs["triton-rocm"]["version"] == "3.8.0" and "triton" not in pkgs
    # The TheRock stack: the ROCm SDK wheels and the GPU's own device wheel only.
    assert {"rocm", "rocm-sdk-core", "rocm-sdk-libraries", "rocm-sdk-device-gfx942"} <= set(pkgs)
    assert not [
        n for n in pkgs if n.startswith("rocm-sdk-device-") and n != "rocm-sdk-device-gfx942"
    ]
    assert pkgs["rocm"]["sdist"] is True and pkgs["rocm"]["hash"] == "verified"
    assert {"jax-rocm7-plugin", "jax-rocm7-pjrt"} <= set(pkgs)
    assert pkgs["jax-triton"]["version"] == "0.4.1"
    assert data["kernel_wheel"]["requirement"] == "greta-kernels-gfx942==0.1.0"
    # Nobody serves it: built here after install, so it is present after install.
    assert data["kernel_wheel"]["status"] == "build"
    assert data["env"]["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert "HSA_OVERRIDE_GFX_VERSION" not in data["env"]
    assert "torch" in data["trust_on_first_use"] and data["ready"] is True
    strict = plan_for(matrix, "mi300x", strict=True).to_json()
    assert strict["ready"] is False
    assert any(b.startswith("torch==2.14.1+rocm7.14: no hash") for b in strict["blockers"])


def test_radeon_gfx1103_runs_natively_on_the_current_row(matrix) -> None:
    data = plan_for(matrix, "radeon", arch="gfx1103").to_json()
    check_consistent(data, "rocm7.14", ROCM714)
    assert data["arch"] == "gfx1103" and data["kernel_arch"] == "gfx1103"
    assert "HSA_OVERRIDE_GFX_VERSION" not in data["env"]
    assert data["kernel_wheel"]["requirement"] == "greta-kernels-gfx1103==0.1.0"
    assert "rocm-sdk-device-gfx1103" in {p["name"] for p in data["packages"]}


def test_radeon_gfx1103_is_never_overridden_on_the_previous_row(matrix) -> None:
    data = build_plan(matrix, load_lock("radeon", "3.12", "previous"), arch="gfx1103").to_json()
    check_consistent(data, "rocm7.2", ROCM72)
    assert data["row"]["name"] == "previous"
    assert "HSA_OVERRIDE_GFX_VERSION" not in data["env"]
    assert any("never sets it" in w for w in data["warnings"])
    assert any("the therock row carries native gfx1103 code" in w for w in data["warnings"])
    # gfx1031 on the previous row: the override is known and safe, so it is set.
    rx = build_plan(matrix, load_lock("radeon", "3.12", "previous"), arch="gfx1031").to_json()
    assert rx["env"]["HSA_OVERRIDE_GFX_VERSION"] == "10.3.0" and rx["kernel_arch"] == "gfx1030"


def test_radeon_gfx1103_from_detection(matrix) -> None:
    apu = Gpu(
        vendor="amd", arch="gfx1103", product="AMD Radeon 780M", pci_id="0x15bf", integrated=True
    )
    detection = Detection(
        target="radeon", primary=0, gpus=[apu], env_seen={"HSA_OVERRIDE_GFX_VERSION": "10.3.0"}
    )
    data = plan_for(matrix, "radeon", detection=detection).to_json()
    assert data["detected"] is True and data["arch"] == "gfx1103"
    assert "HSA_OVERRIDE_GFX_VERSION" not in data["env"]


def test_mixed_arch_gpus_hide_the_others_when_an_override_is_set(matrix) -> None:
    gpus = [
        Gpu(vendor="amd", arch="gfx1031", product="RX 6700 XT", pci_id="0x73df", evidence=("kfd",)),
        Gpu(
            vendor="amd", arch="gfx1100", product="RX 7900 XTX", pci_id="0x744c", evidence=("kfd",)
        ),
    ]
    detection = Detection(target="radeon", primary=0, gpus=gpus)
    lock = load_lock("radeon", "3.12", "previous")
    data = build_plan(matrix, lock, detection=detection).to_json()
    assert data["env"]["HSA_OVERRIDE_GFX_VERSION"] == "10.3.0"
    assert data["env"]["ROCR_VISIBLE_DEVICES"] == "0"
    assert any("gfx1100 GPU(s) are hidden" in w for w in data["warnings"])
    # The user already chose the visible GPUs: no override, and the plan says why.
    chosen = Detection(
        target="radeon", primary=0, gpus=gpus, env_seen={"ROCR_VISIBLE_DEVICES": "0,1"}
    )
    data = build_plan(matrix, lock, detection=chosen).to_json()
    assert "HSA_OVERRIDE_GFX_VERSION" not in data["env"]
    assert any("HSA_OVERRIDE_GFX_VERSION not set" in w for w in data["warnings"])


def test_supported_radeon_arch_needs_no_override(matrix) -> None:
    data = plan_for(matrix, "radeon", arch="gfx1201").to_json()
    assert "HSA_OVERRIDE_GFX_VERSION" not in data["env"]
    assert data["kernel_wheel"]["requirement"] == "greta-kernels-gfx1201==0.1.0"


def test_cuda_plan(matrix) -> None:
    data = plan_for(matrix, "cuda").to_json()
    check_consistent(data, None, "default")
    pkgs = {p["name"]: p["version"] for p in data["packages"]}
    assert pkgs["torch"] == "2.15.0" and pkgs["triton"] == "3.9.0"
    assert pkgs["jax-cuda13-plugin"] == "0.12.0" and pkgs["jax-triton"] == "0.4.1"
    assert data["kernel_wheel"]["requirement"] == "greta-kernels-sm-90==0.1.0"
    assert data["trust_on_first_use"] == [] and data["unverified"] == []
    previous = build_plan(matrix, load_lock("cuda", "3.12", "previous")).to_json()
    check_consistent(previous, "cu130", "https://download.pytorch.org/whl/cu130")


def test_cpu_plan_py311_is_ready_here(matrix) -> None:
    data = plan_for(matrix, "cpu", python="3.11").to_json()
    check_consistent(data, "cpu", "https://download.pytorch.org/whl/cpu")
    assert data["ready"] is True and data["unverified"] == []
    assert data["kernel_wheel"]["status"] == "none"
    assert "Triton's interpreter" in data["kernel_wheel"]["note"]
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
    assert set(data["packages"][0]) == {
        "name",
        "version",
        "index",
        "hash",
        "hashes",
        "role",
        "sdist",
    }
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
    # wheel is trusted on first use, or with --strict built here instead.
    strict = plan_for(matrix, "mi300x", kernel=lookup, strict=True).to_json()
    assert strict["kernel_wheel"]["status"] == "build"
    assert "pins no hash" in strict["kernel_wheel"]["note"]
    no_build = plan_for(matrix, "mi300x", kernel=lookup, strict=True, build_kernels=False)
    assert no_build.kernel_wheel.status == "not-available"
    data = plan_for(matrix, "mi300x", kernel=lookup).to_json()
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
        (("--target", "mi300x"), "rocm7.14"),
        (("--target", "radeon", "--arch", "gfx1151"), "rocm7.14"),
        (("--target", "radeon", "--arch", "gfx1100", "--row", "previous"), "rocm7.2"),
        (("--target", "cuda"), None),
        (("--target", "cpu"), "cpu"),
    ],
)
def test_cli_dry_run_json(args: tuple[str, ...], torch_local: str | None) -> None:
    proc = run_cli("--dry-run", "--json", "--python", "3.12", *args)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["python"]["version"] == "3.12" and data["ready"] is True
    index = f"https://download.pytorch.org/whl/{torch_local}" if torch_local else "default"
    check_consistent(data, torch_local, index)
    names = [s["step"] for s in data["steps"]]
    assert names[:3] == ["plan", "stage", "commit"] and names[-1] == "finish"
    assert "smoke-test" in names and "record-hashes" in names
    assert ("kernel-build" in names) is (data["kernel_wheel"]["status"] == "build")


def test_cli_dry_run_exits_non_zero_when_not_ready() -> None:
    proc = run_cli("--dry-run", "--target", "mi300x", "--python", "3.12", "--strict")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "not ready:" in proc.stdout
    # The vendor downloads are in the command list, hashed or not, each with its vendor's
    # index as the only index.
    assert "--index-url https://download.pytorch.org/whl/rocm7.14" in proc.stdout
    assert "--index-url https://repo.amd.com/rocm/whl-multi-arch" in proc.stdout
    assert "--extra-index-url" not in proc.stdout


def test_cli_errors_are_messages_not_tracebacks() -> None:
    proc = run_cli("--dry-run", "--target", "tpu", "--python", "3.12")
    assert (
        proc.returncode == 2 and "unknown target" in proc.stderr and "Traceback" not in proc.stderr
    )
    proc = run_cli("--dry-run", "--target", "cpu", "--python", "3.9")
    assert proc.returncode == 2 and "Python 3.9 is not covered by GRETA's locks" in proc.stderr
    proc = run_cli("--target", "cpu", "--python", "3.12")
    assert proc.returncode == 2 and "needs --python PATH" in proc.stderr
