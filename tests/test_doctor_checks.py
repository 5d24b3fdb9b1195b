"""Doctor checks as pure functions: each DESIGN.md failure mode rebuilt from hand-made facts."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import pytest

from greta_install.doctor.checks import CHECKS, Check
from greta_install.doctor.checks._common import lspci_gpus
from greta_install.doctor.facts import (
    ContainerInfo,
    DeviceNode,
    Facts,
    InstalledDist,
    MemoryInfo,
    ProbeResult,
    PythonInfo,
    UserGroups,
)
from greta_install.doctor.gfx import gfx_to_override, override_to_gfx
from greta_install.doctor.index_query import classify, query_index
from greta_install.doctor.model import CheckResult, exit_code, summarize
from greta_install.doctor.runner import run_check, run_checks
from greta_install.model import Detection, Gpu

GIB = 1024**3
ROCM_ARCHS = [
    "gfx900",
    "gfx906",
    "gfx908",
    "gfx90a",
    "gfx942",
    "gfx1030",
    "gfx1100",
    "gfx1101",
    "gfx1102",
]
ROCM_INDEX = "https://download.pytorch.org/whl/rocm6.2"


# --- small fakes for the lock (greta_install.locks.lockfile is another helper's module) ---------


@dataclass(frozen=True)
class FakePin:
    name: str
    version: str
    index: str | None = None
    hashes: tuple[str, ...] = ("sha256:00",)
    marker: str | None = None
    verified: bool = True


@dataclass
class FakeLock:
    target: str
    python: str
    packages: tuple[FakePin, ...]
    kernel_wheel: str | None = None
    env: dict[str, str] = field(default_factory=dict)


def gpu(arch: str, *, vendor: str = "amd", integrated: bool = False, **kw: Any) -> Gpu:
    return Gpu(
        vendor=vendor,
        arch=arch,
        product=kw.pop("product", f"GPU {arch}"),
        pci_id=None,
        integrated=integrated,
        **kw,
    )  # type: ignore[arg-type]


def detection(
    target: str, *gpus: Gpu, primary: int | None = 0, env: dict[str, str] | None = None
) -> Detection:
    return Detection(
        target=target, primary=primary if gpus else None, gpus=list(gpus), env=env or {}
    )  # type: ignore[arg-type]


def torch_probe(
    numpy: str = "1.26.4", triton: str | None = "3.6.0", stderr: str = "", **torch: Any
) -> ProbeResult:
    data: dict[str, Any] = {
        "version": "2.5.1+rocm6.2",
        "hip": "6.2.41133",
        "cuda": None,
        "import_warnings": [],
        "cuda_available": True,
        "device_count": 1,
        "arch_list": ROCM_ARCHS,
        "devices": [{"index": 0, "name": "AMD Instinct MI300X", "arch": "gfx942:sramecc+:xnack-"}],
        "smoke": {"ok": True, "value": 16.0},
        "numpy_interop": {"ok": True},
    }
    data.update(torch)
    section = {
        "numpy": {"version": numpy},
        "torch": data,
        "triton": {"version": triton} if triton else {"missing": True},
    }
    return ProbeResult("ok", section, 0, None, stderr, 1.0, 60.0)


def jax_probe(
    platform: str = "gpu", log: list[str] | None = None, version: str = "0.6.0"
) -> ProbeResult:
    data = {
        "version": version,
        "jaxlib": version,
        "backend": platform,
        "devices": [{"platform": platform, "kind": "MI300X" if platform != "cpu" else "cpu"}],
        "platform_version": "rocm 60342" if platform != "cpu" else "cpu",
        "log": log or [],
    }
    return ProbeResult("ok", {"jax": data}, 0, None, "", 1.0, 60.0)


def dists(**versions: str) -> tuple[InstalledDist, ...]:
    out = []
    for key, version in versions.items():
        name = key.replace("_", "-")
        out.append(
            InstalledDist(
                name,
                version,
                provides_triton=name in ("triton", "pytorch-triton-rocm", "triton-rocm"),
            )
        )
    return tuple(out)


def healthy_mi300x(**changes: Any) -> Facts:
    installed = (
        *dists(numpy="1.26.4", pytorch_triton_rocm="3.1.0", jax="0.6.0", jaxlib="0.6.0",
               jax_rocm7_plugin="0.6.0", jax_rocm7_pjrt="0.6.0", greta_kernels_gfx942="0.1.0"),
        InstalledDist("torch", "2.5.1+rocm6.2", requires=("pytorch-triton-rocm==3.1.0", "numpy")),
    )  # fmt: skip
    lock = FakeLock(
        "mi300x",
        "3.11",
        (
            FakePin("torch", "2.5.1+rocm6.2", ROCM_INDEX),
            FakePin("pytorch-triton-rocm", "3.1.0", ROCM_INDEX),
            FakePin("numpy", "1.26.4"),
            FakePin("jax", "0.6.0"),
            FakePin("jaxlib", "0.6.0"),
        ),
        kernel_wheel="greta-kernels-gfx942==0.1.0",
    )
    facts = Facts(
        live=True,
        target="mi300x",
        target_source="detection",
        detection=detection(
            "mi300x", gpu("gfx942", product="AMD Instinct MI300X", vram_bytes=192 * GIB)
        ),
        kfd_sysfs=True,
        env={},
        python=PythonInfo("3.11.9", "/x/.venv/bin/python", "/x/.venv", "/usr"),
        lock=lock,
        lock_pythons=("3.11", "3.12"),
        device_nodes=(
            DeviceNode("/dev/kfd", True, True, True, "render", "crw-rw----"),
            DeviceNode("/dev/dri/renderD128", True, True, True, "render", "crw-rw----"),
        ),
        groups=UserGroups("ana", ("ana", "render", "video"), ("ana", "render", "video")),
        container=ContainerInfo(None),
        dists=tuple(sorted(installed, key=lambda d: d.name)),
        torch_probe=torch_probe(),
        jax_probe=jax_probe(),
        # The installed row's torch wheels: a classic ROCm build (no gfx1031, no gfx1103).
        wheel_archs=tuple(ROCM_ARCHS),
    )
    return dataclasses.replace(facts, **changes)


BY_ID: dict[str, Check] = {c.id: c for c in CHECKS}


def check(check_id: str, facts: Facts) -> CheckResult:
    return run_check(BY_ID[check_id], facts)


def assert_status(result: CheckResult, status: str, *fix_parts: str) -> None:
    assert result.status == status, (result.status, result.finding, result.fix)
    for part in fix_parts:
        assert result.fix and part in result.fix, (part, result.fix)


# --- the healthy machine ---------------------------------------------------------------


def test_healthy_mi300x_has_no_warning_or_failure() -> None:
    results = run_checks(healthy_mi300x())
    bad = [(r.id, r.status, r.finding) for r in results if r.status in ("warn", "fail")]
    assert bad == []
    assert exit_code(results) == 0
    assert summarize(results)["ok"] >= 15
    assert {r.id for r in results} == set(BY_ID)


def test_every_not_ok_finding_carries_a_fix() -> None:
    # A deliberately broken machine: every warn/fail it produces must say what to type.
    facts = healthy_mi300x(
        target="radeon",
        detection=detection(
            "radeon", gpu("gfx1103", integrated=True, vram_bytes=GIB // 2), gpu("gfx1100")
        ),
        env={"HSA_OVERRIDE_GFX_VERSION": "12.9.9"},
        torch_probe=torch_probe(hip=None, cuda="12.4", arch_list=["sm_90"]),
    )
    results = run_checks(facts)
    assert any(r.status == "fail" for r in results)
    for r in results:
        if r.status in ("warn", "fail"):
            assert r.fix, r.id


# --- failure mode 1: the wheel lacks the device's gfx ------------------------------------


def test_fm1_arch_missing_from_wheel_suggests_sibling_override() -> None:
    facts = healthy_mi300x(
        target="radeon",
        detection=detection("radeon", gpu("gfx1032")),
        torch_probe=torch_probe(arch_list=["gfx1030", "gfx1100"]),
    )
    assert_status(check("torch.arch", facts), "fail", "export HSA_OVERRIDE_GFX_VERSION=10.3.0")


def test_fm1_arch_without_sibling_suggests_another_wheel() -> None:
    facts = healthy_mi300x(target="radeon", detection=detection("radeon", gpu("gfx1151")))
    result = check("torch.arch", facts)
    assert_status(result, "fail", "greta install --target radeon")
    assert "invalid device function" in result.finding


def test_fm1_invalid_device_function_at_launch() -> None:
    probe = torch_probe(
        smoke={"ok": False, "error": "RuntimeError: HIP error: invalid device function"},
        arch_list=["gfx1030"],
    )
    facts = healthy_mi300x(
        target="radeon", detection=detection("radeon", gpu("gfx1031")), torch_probe=probe
    )
    assert_status(check("torch.gpu", facts), "fail", "HSA_OVERRIDE_GFX_VERSION=10.3.0")


def test_fm1_ok_when_arch_carried() -> None:
    assert_status(check("torch.arch", healthy_mi300x()), "ok")


def test_cuda_arch_via_ptx_is_ok() -> None:
    probe = torch_probe(hip=None, cuda="12.4", arch_list=["sm_80", "compute_80"])
    facts = healthy_mi300x(
        target="cuda", detection=detection("cuda", gpu("sm_90", vendor="nvidia")), torch_probe=probe
    )
    assert_status(check("torch.arch", facts), "ok")
    probe = torch_probe(hip=None, cuda="12.4", arch_list=["sm_80", "sm_86"])
    assert_status(
        check("torch.arch", dataclasses.replace(facts, torch_probe=probe)), "fail", "greta install"
    )


# --- failure mode 2: unofficial APUs ----------------------------------------------------


def test_fm2_gfx1103_override_is_experimental() -> None:
    facts = healthy_mi300x(
        target="radeon", detection=detection("radeon", gpu("gfx1103", integrated=True))
    )
    result = check("gpu.unofficial", facts)
    # GRETA never sets this override itself: the fix is the row with native gfx1103 code.
    assert_status(result, "warn", "greta install --target radeon --arch gfx1103")
    assert "HSA_OVERRIDE_GFX_VERSION=11.0.0" in result.finding and "hang" in result.finding
    assert "export" not in (result.fix or "")
    assert_status(check("gpu.unofficial", healthy_mi300x()), "ok")
    # With wheels that carry gfx1103 natively (the ROCm 7.14 row) nothing is wrong.
    native = dataclasses.replace(facts, wheel_archs=(*ROCM_ARCHS, "gfx1103"))
    assert_status(check("gpu.unofficial", native), "ok")
    assert check("gpu.override", native).status == "ok"


def test_fm2_hung_probe_on_gfx1103_with_override_suggests_unsetting_it() -> None:
    hung = ProbeResult("timeout", error="did not finish within 60 s and was killed", timeout_s=60)
    facts = healthy_mi300x(
        target="radeon",
        detection=detection("radeon", gpu("gfx1103", integrated=True)),
        env={"HSA_OVERRIDE_GFX_VERSION": "11.0.0"},
        torch_probe=hung,
    )
    assert_status(check("torch.import", facts), "fail", "unset HSA_OVERRIDE_GFX_VERSION")
    # The other torch checks defer to torch.import rather than repeat the failure.
    assert check("torch.arch", facts).status == "skip"


# --- failure mode 3: the override names an arch the wheel lacks --------------------------


def test_fm3_override_not_in_wheel() -> None:
    facts = healthy_mi300x(
        target="radeon",
        detection=detection("radeon", gpu("gfx1031")),
        env={"HSA_OVERRIDE_GFX_VERSION": "11.0.0"},
        torch_probe=torch_probe(arch_list=["gfx1030", "gfx942"]),
    )
    result = check("torch.override", facts)
    assert_status(result, "fail", "export HSA_OVERRIDE_GFX_VERSION=10.3.0")
    assert "gfx1100" in result.finding


def test_fm3_override_ok_when_wheel_carries_it() -> None:
    facts = healthy_mi300x(
        target="radeon",
        detection=detection("radeon", gpu("gfx1031"), env={"HSA_OVERRIDE_GFX_VERSION": "10.3.0"}),
        env={"HSA_OVERRIDE_GFX_VERSION": "10.3.0"},
    )
    for check_id in ("torch.override", "gpu.override", "torch.arch"):
        assert_status(check(check_id, facts), "ok")


def test_fm3_malformed_and_missing_override() -> None:
    det = detection("radeon", gpu("gfx1031"), env={"HSA_OVERRIDE_GFX_VERSION": "10.3.0"})
    assert_status(
        check(
            "gpu.override",
            healthy_mi300x(detection=det, env={"HSA_OVERRIDE_GFX_VERSION": "gfx1030"}),
        ),
        "fail",
        "export HSA_OVERRIDE_GFX_VERSION=10.3.0",
    )
    assert_status(
        check("gpu.override", healthy_mi300x(detection=det, env={})),
        "warn",
        "export HSA_OVERRIDE_GFX_VERSION=10.3.0",
    )
    # A GPU that needs no override, with one set anyway: unset it.
    assert_status(
        check("gpu.override", healthy_mi300x(env={"HSA_OVERRIDE_GFX_VERSION": "11.0.0"})),
        "warn",
        "unset HSA_OVERRIDE_GFX_VERSION",
    )


@pytest.mark.parametrize(
    ("value", "gfx"),
    [
        ("10.3.0", "gfx1030"),
        ("11.0.0", "gfx1100"),
        ("9.4.2", "gfx942"),
        ("9.0.10", "gfx90a"),
        ("11", None),
        ("x.y.z", None),
        ("", None),
    ],
)
def test_override_to_gfx(value: str, gfx: str | None) -> None:
    assert override_to_gfx(value) == gfx
    if gfx:
        assert gfx_to_override(gfx) == value


# --- failure mode 4: device permissions -------------------------------------------------


def locked_out(groups: UserGroups) -> Facts:
    nodes = (
        DeviceNode("/dev/kfd", True, False, False, "render", "crw-rw----"),
        DeviceNode("/dev/dri/renderD128", True, False, False, "render", "crw-rw----"),
    )
    return healthy_mi300x(device_nodes=nodes, groups=groups)


def test_fm4_user_not_in_render_group() -> None:
    facts = locked_out(UserGroups("ana", ("ana",), ("ana",)))
    for check_id in ("devices.kfd", "devices.render"):
        assert_status(check(check_id, facts), "fail", "sudo usermod -aG render,video $USER")


def test_fm4_group_added_but_session_is_stale() -> None:
    facts = locked_out(UserGroups("ana", ("ana",), ("ana", "render")))
    assert_status(check("devices.kfd", facts), "fail", "newgrp render")


def test_fm4_missing_kfd_outside_container_means_driver_not_loaded() -> None:
    facts = healthy_mi300x(device_nodes=(DeviceNode("/dev/kfd", False),))
    assert_status(check("devices.kfd", facts), "fail", "sudo modprobe amdgpu")
    assert_status(check("devices.kfd", healthy_mi300x()), "ok")


# --- failure mode 5: container without devices -----------------------------------------


def test_fm5_container_without_amd_devices() -> None:
    facts = healthy_mi300x(container=ContainerInfo("docker", ("/.dockerenv",)), device_nodes=())
    assert_status(check("container.devices", facts), "fail", "--device=/dev/kfd --device=/dev/dri")
    # The devices checks leave the diagnosis to container.devices instead of blaming the driver.
    assert check("devices.kfd", facts).status == "skip"
    ok_facts = dataclasses.replace(facts, device_nodes=healthy_mi300x().device_nodes)
    assert_status(check("container.devices", ok_facts), "ok")


def test_fm5_container_without_nvidia_devices() -> None:
    lspci = "01:00.0 3D controller [0302]: NVIDIA Corporation GH100 [H100 SXM5 80GB] [10de:2330] (rev a1)\n"
    facts = healthy_mi300x(
        target="cuda", detection=None, kfd_sysfs=False, lspci=lspci,
        container=ContainerInfo("docker", ("/.dockerenv",)), device_nodes=(),
    )  # fmt: skip
    assert_status(check("container.devices", facts), "fail", "--gpus all")


# --- failure mode 6: CUDA/CPU torch shadows ROCm ----------------------------------------


def test_fm6_cuda_torch_on_amd() -> None:
    facts = healthy_mi300x(
        torch_probe=torch_probe(
            version="2.5.1+cu124",
            hip=None,
            cuda="12.4",
            cuda_available=False,
            device_count=0,
            arch_list=[],
        )
    )
    result = check("torch.build", facts)
    assert_status(
        result,
        "fail",
        "greta install --target mi300x",
        f"torch==2.5.1+rocm6.2 --index-url {ROCM_INDEX}",
    )
    assert "torch.version.hip is None" in result.finding
    assert_status(check("torch.gpu", facts), "fail")


def test_fm6_cpu_torch_is_fine_on_cpu_target() -> None:
    facts = healthy_mi300x(
        target="cpu",
        detection=detection("cpu"),
        torch_probe=torch_probe(hip=None, cuda=None, cuda_available=False, arch_list=[]),
    )
    assert_status(check("torch.build", facts), "ok")
    assert_status(check("torch.gpu", facts), "ok")


# --- failure mode 7: pins missing from the index ----------------------------------------


def test_fm7_missing_pin_reported() -> None:
    facts = healthy_mi300x(
        check_index=True, index_status={"torch==2.5.1+rocm6.2": "found", "numpy==9.9.9": "missing"}
    )
    result = check("lock.index", facts)
    assert_status(result, "fail", "greta lock --target mi300x")
    assert "numpy==9.9.9" in result.finding
    assert check("lock.index", healthy_mi300x()).status == "skip"  # not asked: no network use
    offline = healthy_mi300x(
        check_index=True, index_status={"torch==1": "unknown: offline (Network is unreachable)"}
    )
    assert check("lock.index", offline).status == "skip"


def test_fm7_pip_output_classification() -> None:
    assert classify(0, "") == ("found", None)
    assert classify(1, "ERROR: No matching distribution found for Numpy==9.9.9\n") == (
        "missing",
        "numpy",
    )
    assert (
        classify(1, "WARNING: ... Failed to establish a new connection: [Errno -2]")[0] == "offline"
    )
    verdict, line = classify(1, "ERROR: ResolutionImpossible: something\n")
    assert verdict == "error" and line and "ResolutionImpossible" in line


def test_fm7_query_index_isolates_each_missing_pin() -> None:
    calls: list[list[str]] = []

    def fake_run(argv: list[str]) -> tuple[int, str]:
        calls.append(argv)
        pins = [a for a in argv if "==" in a]
        bad = [p for p in pins if p.endswith("==9.9.9")]
        if bad:
            return 1, f"ERROR: No matching distribution found for {bad[0]}\n"
        return 0, ""

    pins = [
        FakePin("numpy", "9.9.9"),
        FakePin("packaging", "24.0"),
        FakePin("rich", "9.9.9"),
        FakePin("torch", "2.5.1", ROCM_INDEX),
    ]
    status = query_index(pins, run=fake_run)
    assert status == {
        "numpy==9.9.9": "missing",
        "packaging==24.0": "found",
        "rich==9.9.9": "missing",
        "torch==2.5.1": "found",
    }
    assert any(ROCM_INDEX in argv for argv in calls)


# --- failure mode 8: triton ---------------------------------------------------------------


def test_fm8_two_triton_providers() -> None:
    facts = healthy_mi300x(
        dists=(*healthy_mi300x().dists, InstalledDist("triton", "3.1.0", provides_triton=True))
    )
    result = check("triton.providers", facts)
    assert_status(
        result, "fail", "pip uninstall -y", "pytorch-triton-rocm", "greta install --target mi300x"
    )
    assert "triton" in result.details["providers"]


def test_fm8_triton_version_not_what_torch_requires() -> None:
    base = healthy_mi300x()
    changed = tuple(
        InstalledDist(d.name, "3.0.0", True) if d.name == "pytorch-triton-rocm" else d
        for d in base.dists
    )
    result = check("triton.version", dataclasses.replace(base, dists=changed))
    assert_status(result, "fail", "pytorch-triton-rocm==3.1.0", f"--extra-index-url {ROCM_INDEX}")
    assert_status(check("triton.version", base), "ok")


def test_fm8_requirement_with_false_marker_is_ignored() -> None:
    base = healthy_mi300x()
    torch = InstalledDist(
        "torch", "2.5.1", requires=("triton==9.0; platform_system == 'NoSuchOS'",)
    )
    facts = dataclasses.replace(
        base, dists=tuple(torch if d.name == "torch" else d for d in base.dists)
    )
    assert_status(check("triton.version", facts), "ok")


# --- failure mode 9: iGPU beside dGPU --------------------------------------------------


def test_fm9_igpu_first() -> None:
    det = detection("radeon", gpu("gfx1103", integrated=True), gpu("gfx1100"), primary=1)
    result = check("gpu.multi", healthy_mi300x(target="radeon", detection=det))
    assert_status(result, "warn", "ROCR_VISIBLE_DEVICES=1", "HIP_VISIBLE_DEVICES=1")
    chosen = healthy_mi300x(target="radeon", detection=det, env={"ROCR_VISIBLE_DEVICES": "1"})
    assert_status(check("gpu.multi", chosen), "ok")
    dgpu_first = detection("radeon", gpu("gfx1100"), gpu("gfx1103", integrated=True))
    assert_status(check("gpu.multi", healthy_mi300x(detection=dgpu_first)), "ok")


# --- failure mode 10: APU carve-out -------------------------------------------------------


def test_fm10_tiny_carve_out() -> None:
    apu = gpu("gfx1103", integrated=True, vram_bytes=512 * 1024**2, gtt_bytes=16 * GIB)
    # torch's view unknown, RAM unknown: the carve-out alone is the warning.
    no_view = healthy_mi300x(
        target="radeon", detection=detection("radeon", apu), torch_probe=torch_probe(devices=[])
    )
    result = check("gpu.apu_memory", no_view)
    assert_status(result, "warn", "UMA Frame Buffer Size", "amdgpu.gttsize")
    assert "0.5 GiB" in result.finding and "16.0 GiB" in result.finding
    roomy = gpu("gfx1151", integrated=True, vram_bytes=64 * GIB, gtt_bytes=32 * GIB)
    assert_status(
        check("gpu.apu_memory", healthy_mi300x(detection=detection("radeon", roomy))), "ok"
    )


def _apu_facts(torch_sees: int, ram: int, pages: int | None) -> Facts:
    apu = gpu("gfx1151", integrated=True, vram_bytes=512 * 1024**2, gtt_bytes=None)
    probe = torch_probe(devices=[{"index": 0, "name": "Radeon 8060S", "total_memory": torch_sees}])
    return healthy_mi300x(
        target="radeon",
        detection=detection("radeon", apu),
        torch_probe=probe,
        memory=MemoryInfo(ram_bytes=ram, ttm_pages_limit=pages),
    )


def test_fm10_apu_memory_reports_ram_ttm_and_torch_and_fixes_a_small_limit() -> None:
    # 128 GiB of RAM but torch sees 15.5 GiB (the default TTM limit is half of RAM or less).
    small = _apu_facts(int(15.5 * GIB), 128 * GIB, (int(15.5 * GIB)) // 4096)
    result = check("gpu.apu_memory", small)
    pages = (128 * GIB * 3 // 4) // 4096
    assert_status(
        result,
        "warn",
        f"ttm.pages_limit={pages}",
        "PYTORCH_HIP_ALLOC_CONF=expandable_segments:True",
    )
    assert "RAM 128.0 GiB" in result.finding and "torch sees 15.5 GiB" in result.finding
    assert result.details["ttm_limit_bytes"] == (int(15.5 * GIB) // 4096) * 4096
    # The same machine after the fix: torch sees 96 GiB of the 128.
    fixed = _apu_facts(96 * GIB, 128 * GIB, pages)
    assert_status(check("gpu.apu_memory", fixed), "ok")


# --- failure mode 11: jax versions and plugin -------------------------------------------


def test_fm11_plugin_version_differs() -> None:
    base = healthy_mi300x()
    changed = tuple(
        InstalledDist(d.name, "0.5.0") if d.name == "jax-rocm7-plugin" else d for d in base.dists
    )
    result = check("jax.versions", dataclasses.replace(base, dists=changed))
    assert_status(
        result, "fail", "jax-rocm7-plugin==0.6.0", "jax-rocm7-pjrt==0.6.0", "jaxlib==0.6.0"
    )


def test_fm11_plugin_installed_but_not_loading() -> None:
    log = [
        "Jax plugin configuration error: Exception when calling jax_plugins.xla_rocm7.initialize()"
    ]
    result = check("jax.gpu", healthy_mi300x(jax_probe=jax_probe("cpu", log)))
    assert_status(result, "fail", "--force-reinstall", "jax-rocm7-plugin==0.6.0")
    assert "plugin configuration error" in result.finding
    assert_status(check("jax.gpu", healthy_mi300x()), "ok")


def test_fm11_no_plugin_on_gpu_target() -> None:
    base = healthy_mi300x()
    no_plugin = tuple(d for d in base.dists if "rocm7" not in d.name)
    result = check(
        "jax.gpu", dataclasses.replace(base, dists=no_plugin, jax_probe=jax_probe("cpu"))
    )
    assert_status(result, "warn", "jax-rocm7-plugin==0.6.0")


# --- failure mode 12: NumPy 2 beside a NumPy-1 torch -------------------------------------


def test_fm12_numpy2_with_numpy1_torch() -> None:
    probe = torch_probe(
        numpy="2.1.3",
        import_warnings=["Failed to initialize NumPy: _ARRAY_API not found"],
        numpy_interop={"ok": False, "error": "RuntimeError: Numpy is not available"},
        stderr="A module that was compiled using NumPy 1.x cannot be run in\nNumPy 2.1.3 as it may crash.",
    )
    result = check("numpy.torch", healthy_mi300x(torch_probe=probe))
    assert_status(result, "fail", "numpy<2")
    assert "2.1.3" in result.finding
    assert_status(check("numpy.torch", healthy_mi300x()), "ok")


# --- basics -------------------------------------------------------------------------------


def test_lock_drift_and_unverified_pins() -> None:
    base = healthy_mi300x()
    lock = dataclasses.replace(
        base.lock, packages=(*base.lock.packages, FakePin("packaging", "24.0", verified=False))
    )
    result = check("lock.installed", dataclasses.replace(base, lock=lock))
    assert_status(result, "warn", "greta install --target mi300x", "packaging==24.0")
    assert "missing" in result.finding and "unverified" in result.finding
    assert result.details["unverified"] == ["packaging"]


def test_lock_accepts_local_label_and_reports_mismatch() -> None:
    base = healthy_mi300x()
    lock = dataclasses.replace(
        base.lock, packages=(FakePin("torch", "2.5.1", ROCM_INDEX), FakePin("numpy", "2.0.0"))
    )
    result = check("lock.installed", dataclasses.replace(base, lock=lock))
    assert result.status == "warn"
    assert list(result.details["mismatched"]) == ["numpy"]  # torch 2.5.1+rocm6.2 matches ==2.5.1


def test_no_lock_for_this_python() -> None:
    facts = healthy_mi300x(
        lock=None,
        lock_error="no lock for Python 3.13",
        lock_pythons=("3.11", "3.12"),
        python=PythonInfo("3.13.1", "/v/bin/python", "/v", "/usr"),
    )
    # Nothing installs on this interpreter: a failure (non-zero exit), and the fix is the
    # one a user types, never the maintainers' `greta lock`.
    assert_status(check("python.version", facts), "fail", "python3.12 -m venv")
    result = check("lock.installed", facts)
    assert_status(result, "fail", "python3.12 -m venv", "greta install --target mi300x")
    assert "greta lock" not in (result.fix or "")


def test_apu_memory_is_never_ok_about_nothing() -> None:
    # A Strix Halo snapshot without /proc/meminfo, GTT, TTM or a torch view.
    apu = gpu("gfx1151", integrated=True)
    facts = healthy_mi300x(
        target="radeon", detection=detection("radeon", apu), torch_probe=torch_probe(devices=[])
    )
    result = check("gpu.apu_memory", facts)
    assert result.status == "skip", result
    assert "not measured" in result.finding


def test_system_python_warns() -> None:
    facts = healthy_mi300x(
        python=PythonInfo("3.11.9", "/usr/bin/python3", "/usr", "/usr", externally_managed=True)
    )
    result = check("python.venv", facts)
    assert_status(result, "warn", "-m venv .venv")
    assert "externally managed" in result.finding


def test_kernel_wheel_missing() -> None:
    base = healthy_mi300x()
    facts = dataclasses.replace(
        base, dists=tuple(d for d in base.dists if not d.name.startswith("greta-kernels"))
    )
    assert_status(
        check("kernels.wheel", facts),
        "warn",
        "greta install --target mi300x",
        "greta-kernels-gfx942==0.1.0",
    )
    assert_status(check("kernels.wheel", base), "ok")


def test_probe_crash_is_a_finding() -> None:
    crashed = ProbeResult(
        "crashed",
        error="was killed by SIGSEGV",
        returncode=-11,
        stderr_tail="Fatal Python error: Segmentation fault",
    )
    result = check("torch.import", healthy_mi300x(torch_probe=crashed))
    assert_status(result, "fail", "faulthandler")
    assert "SIGSEGV" in result.finding and "Segmentation fault" in result.finding


def test_sriov_pf_host_from_lspci_and_from_detection() -> None:
    lspci = (
        "85:00.0 Processing accelerators [1200]: Advanced Micro Devices, Inc. [AMD/ATI] Aqua Vanjaram [Instinct MI300X] [1002:74a1]\n"
        "        Kernel driver in use: gim # PF\n"
        "85:02.0 Processing accelerators [1200]: Advanced Micro Devices, Inc. [AMD/ATI] Device [1002:74b5]\n"
        "        Kernel driver in use: vfio-pci\n"
    )
    assert [(d.device, d.driver) for d in lspci_gpus(lspci)] == [
        ("74a1", "gim"),
        ("74b5", "vfio-pci"),
    ]
    result = check("gpu.sriov", healthy_mi300x(live=False, detection=None, lspci=lspci))
    assert_status(result, "fail", "modprobe")
    assert "not usable" in result.finding
    pf = gpu("gfx942", usable=False, note="SR-IOV PF bound to gim")
    assert_status(check("gpu.sriov", healthy_mi300x(detection=detection("mi300x", pf))), "fail")
    assert_status(check("gpu.sriov", healthy_mi300x()), "ok")


def test_snapshot_facts_skip_framework_checks() -> None:
    facts = healthy_mi300x(live=False)
    for check_id in (
        "torch.import",
        "torch.gpu",
        "numpy.torch",
        "jax.versions",
        "triton.providers",
        "lock.installed",
        "python.venv",
    ):
        result = check(check_id, facts)
        assert result.status == "skip" and "snapshot" in result.finding, check_id


def test_a_raising_check_becomes_a_warning() -> None:
    def broken(facts: Facts) -> Any:
        raise KeyError("boom")

    result = run_check(Check("x.broken", "broken", broken), healthy_mi300x())
    assert result.status == "warn"
    assert "internal error in check x.broken" in result.finding


def test_garbage_facts_never_raise() -> None:
    # Probe JSON of the wrong shape (a different probe version, a truncated line) and an
    # empty machine: every check must still return a result of its own, none internal errors.
    weird = ProbeResult(
        "ok", {"torch": {"devices": "nope", "arch_list": None, "version": 3}, "numpy": "x"}, 0
    )
    for facts in (
        Facts(live=True),
        Facts(live=False),
        healthy_mi300x(torch_probe=weird, jax_probe=ProbeResult("ok", {"jax": []})),
    ):
        for result in run_checks(facts):
            assert not result.details.get("internal_error"), (result.id, result.finding)


def test_lock_env_must_be_in_effect() -> None:
    base = healthy_mi300x()
    lock = dataclasses.replace(base.lock, env={"TRITON_INTERPRET": "1"})
    result = check("lock.env", dataclasses.replace(base, lock=lock))
    assert_status(result, "warn", 'eval "$(greta env)"', "export TRITON_INTERPRET=1")
    probe = dataclasses.replace(
        base.torch_probe, data={**base.torch_probe.data, "env": {"TRITON_INTERPRET": "1"}}
    )
    assert_status(check("lock.env", dataclasses.replace(base, lock=lock, torch_probe=probe)), "ok")


def test_jax_plugin_fix_follows_the_lock() -> None:
    base = healthy_mi300x(target="cuda", detection=detection("cuda", gpu("sm_90", vendor="nvidia")))
    lock = dataclasses.replace(
        base.lock,
        packages=(
            FakePin("jax", "0.6.0"),
            FakePin("jax-cuda13-plugin", "0.6.0"),
            FakePin("jax-cuda13-pjrt", "0.6.0"),
        ),
    )
    no_plugin = tuple(d for d in base.dists if "rocm7" not in d.name)
    result = check(
        "jax.gpu", dataclasses.replace(base, lock=lock, dists=no_plugin, jax_probe=jax_probe("cpu"))
    )
    assert_status(result, "warn", "jax-cuda13-plugin==0.6.0", "jax-cuda13-pjrt==0.6.0")


def test_triton_provider_must_be_the_rows_pinned_distribution() -> None:
    # ROCm row: the lock pins triton-rocm; jax-triton's dependency pulled the default
    # index's `triton` in instead of it.
    installed = tuple(
        d if d.name != "pytorch-triton-rocm" else InstalledDist("triton", "3.8.0", True)
        for d in healthy_mi300x().dists or ()
    )
    facts = healthy_mi300x(dists=installed)
    result = check("triton.providers", facts)
    assert_status(result, "fail", "pip uninstall -y triton")
    assert "pins pytorch-triton-rocm" in result.finding
    assert_status(check("triton.providers", healthy_mi300x()), "ok")


def test_doctor_judges_an_environment_against_the_row_it_holds() -> None:
    from greta_install.doctor.collect import collect_lock, installed_row

    old = (InstalledDist("torch", "2.11.0+rocm7.2"),)
    row = installed_row("radeon", "3.12", old)
    assert row is not None and row.generation == "previous"
    assert "gfx1103" not in row.torch_archs  # so gfx1103 is judged against classic wheels
    current = installed_row("radeon", "3.12", (InstalledDist("torch", "2.14.1+rocm7.14"),))
    assert current is not None and current.generation == "current"
    assert "gfx1103" not in current.torch_archs  # pytorch.org's build lacks it (archs.py)
    therock = installed_row("radeon", "3.12", (InstalledDist("torch", "2.12.0+rocm7.14.0"),))
    assert therock is not None and therock.generation == "therock"
    assert "gfx1103" in therock.torch_archs
    assert installed_row("radeon", "3.12", None).generation == "current"  # type: ignore[union-attr]
    lock, error, _ = collect_lock("radeon", "3.12", "previous")
    assert error is None and lock.package("torch").version == "2.11.0+rocm7.2"


@pytest.mark.parametrize(
    ("triton", "status"),
    [("3.6.0", "ok"), ("3.8.0", "ok"), ("3.9.0", "ok"), ("3.5.1", "warn"), ("3.10.0", "warn")],
)
def test_fast_launch_names_an_unsupported_triton(triton: str, status: str) -> None:
    result = check("triton.fast_launch", healthy_mi300x(torch_probe=torch_probe(triton=triton)))
    assert result.status == status, result.finding
    if status == "warn":
        assert result.finding.startswith(f"fast launch off: Triton {triton} not supported")
    else:
        assert result.finding.startswith(f"fast launch on: Triton {triton}")
    assert check("triton.fast_launch", healthy_mi300x(target="cpu")).status == "skip"


def test_build_claims_only_what_detection_saw() -> None:
    # `greta doctor --target cuda` on a machine without any GPU, CPU torch installed.
    cpu_torch = torch_probe(version="2.13.0+cpu", hip=None, cuda=None, devices=[])
    facts = healthy_mi300x(
        target="cuda", target_source="option", detection=detection("cpu"), torch_probe=cpu_torch
    )
    result = check("torch.build", facts)
    assert_status(result, "fail", "greta install --target cuda", "greta install --target cpu")
    assert "is present" not in result.finding
    assert "no NVIDIA GPU" in result.finding
    # With an NVIDIA GPU detected, the finding says so.
    h100 = gpu("sm_90", vendor="nvidia")
    facts = healthy_mi300x(target="cuda", detection=detection("cuda", h100), torch_probe=cpu_torch)
    result = check("torch.build", facts)
    assert "an NVIDIA GPU is present" in result.finding


def test_gpu_check_on_a_machine_without_a_gpu_offers_the_cpu_target() -> None:
    # The same machine: torch.gpu says detection saw no NVIDIA GPU either, and offers the
    # target of the machine as detected beside the cuda reinstall.
    cpu_torch = torch_probe(
        version="2.13.0+cpu",
        hip=None,
        cuda=None,
        devices=[],
        cuda_available=False,
        device_count=0,
        smoke={},
    )
    facts = healthy_mi300x(
        target="cuda", target_source="option", detection=detection("cpu"), torch_probe=cpu_torch
    )
    result = check("torch.gpu", facts)
    assert_status(result, "fail", "greta install --target cpu")
    assert "detection found no NVIDIA GPU on this machine either" in result.finding
    # With the GPU detected, the finding does not say it is missing.
    h100 = gpu("sm_90", vendor="nvidia")
    facts = healthy_mi300x(target="cuda", detection=detection("cuda", h100), torch_probe=cpu_torch)
    result = check("torch.gpu", facts)
    assert "detection found no" not in result.finding
    assert "--target cpu" not in (result.fix or "")
    assert "--target cpu" not in (result.fix or "")


def test_env_fix_for_another_target_is_an_export_not_the_saved_fixes() -> None:
    # --target names another target than the last install: the saved fixes are that
    # install's, so the fix is the export alone.
    base = healthy_mi300x(target_source="option")
    lock = dataclasses.replace(base.lock, env={"XLA_PYTHON_CLIENT_PREALLOCATE": "false"})
    result = check("lock.env", dataclasses.replace(base, lock=lock))
    assert_status(result, "warn", "export XLA_PYTHON_CLIENT_PREALLOCATE=false")
    assert "greta env" not in (result.fix or "")
