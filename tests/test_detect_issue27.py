"""Detection on every machine users have: output forms, mixed boxes, odd devices (issue 27).

The per-snapshot expectations live in tests/data/snapshots/*/expected.json (checked by
test_detect_snapshots.py); these tests pin the rules those snapshots exercise.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import SNAPSHOTS

from greta_install import archs
from greta_install.detection.detect import _pick_primary, conclude, detect
from greta_install.detection.evidence import Evidence
from greta_install.detection.parsers import amd_smi, rocm_smi
from greta_install.detection.system_view import SnapshotSystem
from greta_install.locks.lockfile import load_lock
from greta_install.locks.matrix import load_matrix
from greta_install.model import Gpu
from greta_install.plan.install_plan import build_plan


def _detect(name: str, root: Path = SNAPSHOTS):
    return detect(SnapshotSystem(root / name))


def test_list_and_static_pasted_together_are_one_gpu() -> None:
    text = (SNAPSHOTS / "strix-point-amdsmi-list-static" / "amd-smi.txt").read_text()
    records = amd_smi.parse(text).records
    assert len(records) == 1
    gpu = records[0]
    # list gave the KFD identity, static the device, the arch and the compute units
    assert (gpu.kfd_id, gpu.node_id) == ("57812", 1)
    assert (gpu.device_id, gpu.gfx, gpu.compute_units) == ("0x150e", "gfx1150", 16)


def test_rocm_smi_gfx_version_is_decimal() -> None:
    assert rocm_smi.gfx_from_decimal("gfx9010") == "gfx90a"
    assert rocm_smi.gfx_from_decimal("gfx9012") == "gfx90c"
    assert rocm_smi.gfx_from_decimal("gfx942") == "gfx942"
    assert rocm_smi.gfx_from_decimal("gfx1100") == "gfx1100"
    assert rocm_smi.gfx_from_decimal("gfx90a") == "gfx90a"
    assert rocm_smi.gfx_from_decimal("N/A") is None


def test_card_model_that_is_a_subsystem_id_is_not_a_device_id() -> None:
    text = (SNAPSHOTS / "mi100-x2-rocmsmi-csv" / "rocm-smi.txt").read_text()
    records = rocm_smi.parse(text).records
    assert [r.device_id for r in records] == [None, None]
    assert [r.keys["card model"] for r in records] == ["0x0c34", "0x0c34"]


def test_merge_by_kfd_identity_without_a_bus_id() -> None:
    det = _detect("mi210-x2-rocmsmi-amdsmi-list")
    # rocm-smi has no bus id: its GPU[1] (node 3, GUID 36740) is amd-smi's 0000:83:00.0
    assert [g.pci_bus for g in det.gpus] == ["0000:03:00.0", "0000:83:00.0"]
    ev = Evidence()
    ev.rocm_smi = rocm_smi.parse(
        (SNAPSHOTS / "mi210-x2-rocmsmi-amdsmi-list" / "rocm-smi.txt").read_text()
    ).records[::-1]
    ev.amd_smi = amd_smi.parse(
        (SNAPSHOTS / "mi210-x2-rocmsmi-amdsmi-list" / "amd-smi.txt").read_text()
    ).records
    swapped = conclude(ev)
    # listed in the other order, still two GPUs, each with both tools
    assert len(swapped.gpus) == 2
    assert all(g.evidence == ("amd-smi", "rocm-smi") for g in swapped.gpus)


def _gpu(vendor: str, arch: str | None, **kw) -> Gpu:
    return Gpu(vendor=vendor, arch=arch, product=kw.pop("product", arch), pci_id=None, **kw)


def test_primary_is_never_chosen_by_vendor_or_order() -> None:
    # An old NVIDIA card no locked build supports, listed first, beside a Radeon.
    gtx1060 = _gpu("nvidia", "sm_61", vram_bytes=6 << 30)
    rx9070 = _gpu("amd", "gfx1201", vram_bytes=16 << 30, compute_units=56)
    assert _pick_primary([gtx1060, rx9070]) == 1
    assert _pick_primary([rx9070, gtx1060]) == 0
    # A tiny iGPU listed first beside a discrete Radeon.
    raphael = _gpu("amd", "gfx1036", integrated=True, compute_units=2)
    xtx = _gpu("amd", "gfx1100", compute_units=96)
    assert _pick_primary([raphael, xtx]) == 1
    # Between two supported discrete GPUs, the one with more compute units.
    small = _gpu("amd", "gfx1102", compute_units=32)
    assert _pick_primary([small, xtx]) == 1
    # An unusable GPU never beats a usable one.
    assert _pick_primary([_gpu("amd", "gfx942", usable=False), small]) == 1


MIXED = "rx6700xt-gtx970-lspci-iommu"


@pytest.mark.parametrize("reverse", [False, True])
def test_real_mixed_box_old_nvidia_beside_a_radeon(reverse: bool, tmp_path: Path) -> None:
    # A real paste: the IOMMU-group listing of one box with a GTX 970 (Maxwell, sm_52)
    # beside an RX 6700 XT. Listed in either order, the Radeon is the primary and the
    # NVIDIA card is kept in the list with why it is not.
    root = tmp_path / MIXED
    shutil.copytree(SNAPSHOTS / MIXED, root)
    if reverse:
        text = (root / "lspci.txt").read_text()
        amd, nvidia = text.split("\n\n", 1)
        (root / "lspci.txt").write_text(nvidia + "\n" + amd + "\n")
    det = detect(SnapshotSystem(root))
    assert (det.target, det.arch, det.state) == ("radeon", "gfx1031", "usable")
    assert [(g.vendor, g.arch) for g in det.gpus] == (
        [("nvidia", "sm_52"), ("amd", "gfx1031")]
        if reverse
        else [("amd", "gfx1031"), ("nvidia", "sm_52")]
    )
    assert det.primary_gpu is not None and det.primary_gpu.pci_bus == "0d:00.0"
    skipped = [w for w in det.warnings if w.startswith("skipped GPU")]
    assert len(skipped) == 1
    assert "GeForce GTX 970" in skipped[0]
    assert "carry code for sm_75 and newer only" in skipped[0]


def test_nvidia_chip_codes_name_the_older_archs() -> None:
    # lspci names old cards by chip ("GM204 [GeForce GTX 970]"); each maps to its arch,
    # and none of them is one a locked build runs.
    cases = {
        "GM204 [GeForce GTX 970]": "sm_52",
        "GK208B [GeForce GT 710]": "sm_35",
        "GM107 [GeForce GTX 750 Ti]": "sm_50",
        "GM107M [GeForce GTX 960M]": "sm_50",
        "GK106GL [Quadro K4000]": "sm_30",
        "GK210GL [Tesla K80]": "sm_37",
        "GP104 [GeForce GTX 1080]": "sm_61",
        "GP100GL [Tesla P100 PCIe 16GB]": "sm_60",
    }
    for name, sm in cases.items():
        assert archs.sm_from_name(name) == sm, name
        assert not archs.locked_build_supports("nvidia", sm), name
    # newer chips keep the names they had
    assert archs.sm_from_name("GA107M [GeForce RTX 3050 Ti Mobile]") == "sm_86"
    assert archs.sm_from_name("NVIDIA GeForce RTX 4090") == "sm_89"


def test_cuda_min_sm_matches_the_cuda_row_of_the_matrix() -> None:
    spec = load_matrix().target("cuda")
    assert min(archs.sm_number(a) or 0 for a in spec.archs) == archs.CUDA_MIN_SM


def test_every_matrix_arch_is_supported_by_a_locked_build() -> None:
    matrix = load_matrix()
    for name in ("mi300x", "instinct", "radeon", "cuda"):
        for arch in matrix.target(name).archs:
            vendor = "nvidia" if arch.startswith("sm_") else "amd"
            assert archs.locked_build_supports(vendor, arch), arch
    # newer NVIDIA archs run the builds' older code; a Jetson (no PCI bus) runs no lock
    assert archs.locked_build_supports("nvidia", "sm_87")
    assert archs.locked_build_supports("nvidia", "sm_103")
    assert not archs.locked_build_supports("nvidia", "sm_87", soc=True)
    # carried by the ROCm 7.2 wheels but known bad without a target; carried by no build
    assert not archs.locked_build_supports("amd", "gfx906")
    assert not archs.locked_build_supports("amd", "gfx940")
    assert "carried by no torch build" in archs.unsupported_reason("gfx940")


def test_locked_build_support_is_read_from_the_torch_builds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The primary-GPU rule and the plan read one fact: drop an arch from every build's
    # list and it stops being supported.
    def drop(*gone: str) -> None:
        for key, build in list(archs.TORCH_BUILDS.items()):
            kept = tuple(a for a in build.archs if a not in gone)
            monkeypatch.setitem(archs.TORCH_BUILDS, key, replace(build, archs=kept))

    assert archs.locked_build_supports("amd", "gfx1031")
    drop("gfx1031")  # still runs as gfx1030 through its known override
    assert archs.locked_build_supports("amd", "gfx1031")
    drop("gfx1030")
    assert not archs.locked_build_supports("amd", "gfx1031")
    assert archs.locked_build_supports("nvidia", "sm_75")
    drop("sm_75")
    assert not archs.locked_build_supports("nvidia", "sm_75")
    assert archs.locked_build_supports("nvidia", "sm_80")


def test_present_but_unusable_gets_a_plan_blocker_with_the_fix() -> None:
    det = _detect("mi300x-container-kfd-einval")
    assert det.state == "unusable"
    plan = build_plan(load_matrix(), load_lock("mi300x", "3.12"), detection=det).to_json()
    assert not plan["ready"]
    assert any("/dev/kfd" in b and "--device=/dev/kfd" in b for b in plan["blockers"])
    # a usable machine's plan has no such blocker
    ok = _detect("mi300x-x4")
    assert ok.state == "usable" and ok.blockers == []
    plan = build_plan(load_matrix(), load_lock("mi300x", "3.12"), detection=ok).to_json()
    assert plan["blockers"] == []


def test_no_gpu_is_state_none(tmp_path: Path) -> None:
    det = detect(SnapshotSystem(tmp_path))
    assert det.state == "none" and det.gpus == [] and det.target == "cpu"


AMD_SNAPSHOTS_WITH_ROCM_SMI = [
    p.name
    for p in sorted(SNAPSHOTS.iterdir())
    if (p / "rocm-smi.txt").is_file() and ((p / "amd-smi.txt").is_file() or (p / "sys").is_dir())
]


def test_rocm10_snapshot_without_rocm_smi_detects_like_the_full_one() -> None:
    full = _detect("mi210-x2-rocmsmi-amdsmi-list")
    rocm10 = _detect("mi210-x2-amdsmi-list-only")
    assert (rocm10.target, rocm10.arch, rocm10.state) == (full.target, full.arch, full.state)
    assert [(g.pci_bus, g.pci_id, g.arch) for g in rocm10.gpus] == [
        (g.pci_bus, g.pci_id, g.arch) for g in full.gpus
    ]


@pytest.mark.parametrize("name", AMD_SNAPSHOTS_WITH_ROCM_SMI)
def test_dropping_rocm_smi_keeps_the_detection(name: str, tmp_path: Path) -> None:
    shutil.copytree(SNAPSHOTS / name, tmp_path / name)
    (tmp_path / name / "rocm-smi.txt").unlink()
    full, rocm10 = _detect(name), _detect(name, tmp_path)
    assert (rocm10.target, rocm10.arch, rocm10.state) == (full.target, full.arch, full.state)
    assert [(g.pci_bus, g.arch) for g in rocm10.gpus] == [(g.pci_bus, g.arch) for g in full.gpus]


def test_there_is_a_rocm10_case() -> None:
    assert AMD_SNAPSHOTS_WITH_ROCM_SMI


def _doctor(path: Path) -> dict[str, tuple[str, str]]:
    from greta_install.doctor.collect import collect_facts
    from greta_install.doctor.runner import run_checks

    facts = collect_facts(SnapshotSystem(path), snapshot=str(path))
    return {r.id: (r.status, r.finding) for r in run_checks(facts)}


def test_rocm10_snapshot_doctors_like_the_full_one() -> None:
    full = _doctor(SNAPSHOTS / "mi210-x2-rocmsmi-amdsmi-list")
    rocm10 = _doctor(SNAPSHOTS / "mi210-x2-amdsmi-list-only")
    assert full.keys() == rocm10.keys()
    differ = {k: (full[k], rocm10[k]) for k in full if full[k] != rocm10[k]}
    assert differ == {}
    assert full["gpu.detect"][0] == "ok"


@pytest.mark.parametrize("name", AMD_SNAPSHOTS_WITH_ROCM_SMI)
def test_dropping_rocm_smi_keeps_the_doctor(name: str, tmp_path: Path) -> None:
    shutil.copytree(SNAPSHOTS / name, tmp_path / name)
    (tmp_path / name / "rocm-smi.txt").unlink()
    full, rocm10 = _doctor(SNAPSHOTS / name), _doctor(tmp_path / name)
    assert {k: v[0] for k, v in full.items()} == {k: v[0] for k, v in rocm10.items()}


def _live_amd_view(can_open: bool | None = None, **files: str) -> object:
    from fake_view import FakeView

    class LiveView(FakeView):
        def can_open_rw(self, path: str) -> bool:
            assert path == "/dev/kfd"
            return bool(can_open)

    props = (SNAPSHOTS / "mi210-kfd/sys/class/kfd/kfd/topology/nodes/2/properties").read_text()
    cls = FakeView if can_open is None else LiveView
    return cls(
        files={"/sys/class/kfd/kfd/topology/nodes/2/properties": props, **files}, is_live=True
    )


def test_live_container_without_dev_kfd_is_unusable_with_the_fix() -> None:
    det = detect(_live_amd_view())
    assert det.gpus and det.state == "unusable"
    assert any("--device=/dev/kfd" in b for b in det.blockers), det.blockers


def test_live_dev_kfd_not_permitted() -> None:
    det = detect(_live_amd_view(can_open=False, **{"/dev/kfd": ""}))
    assert det.state == "unusable"
    assert any("usermod -aG render,video" in b for b in det.blockers), det.blockers
    assert detect(_live_amd_view(can_open=True, **{"/dev/kfd": ""})).state == "usable"


def test_doctor_fails_gpu_detect_with_the_fix_when_the_gpu_is_unusable() -> None:
    from greta_install.doctor.collect import collect_facts
    from greta_install.doctor.runner import run_checks

    path = SNAPSHOTS / "mi100-x4-container-kfd-denied"
    facts = collect_facts(SnapshotSystem(path), snapshot=str(path))
    result = next(r for r in run_checks(facts) if r.id == "gpu.detect")
    assert result.status == "fail"
    assert "/dev/kfd (Permission denied)" in result.finding
    assert "usermod -aG render,video" in (result.fix or "")


def test_rocm_smi_json_on_one_line_and_its_system_object() -> None:
    # `rocm-smi -a --json` prints one line; the "system" object is no GPU.
    text = (
        '{"card0": {"Device ID": "0x74a1", "PCI Bus": "0000:0C:00.0", "GFX Version": "gfx942"}, '
        '"card1": {"Device ID": "0x74a1"}, "system": {"Driver version": "6.7.0", '
        '"Device ID": "0x7408"}}'
    )
    records = rocm_smi.parse(text).records
    assert [(r.index, r.device_id, r.pci_bus, r.gfx) for r in records] == [
        (0, "0x74a1", "0000:0c:00.0", "gfx942"),
        (1, "0x74a1", None, None),
    ]


def test_amd_smi_json_after_tool_warnings_is_read() -> None:
    det = _detect("rx7800xt-amdsmi-static-json-cut")
    assert [(g.pci_id, g.arch, g.compute_units) for g in det.gpus] == [("0x747e", "gfx1101", 60)]


def test_install_plan_blocks_the_gpu_install_but_not_an_explicit_cpu_one() -> None:
    import json
    import subprocess
    import sys

    snap = str(SNAPSHOTS / "mi100-x4-container-kfd-denied")

    def plan(*extra: str) -> dict:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "greta",
                "install",
                "--dry-run",
                "--json",
                "--snapshot",
                snap,
                *extra,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        return json.loads(out.stdout)

    detected = plan()
    assert not detected["ready"]
    assert any("usermod -aG render,video" in b for b in detected["blockers"])
    asked = plan("--target", "cpu")
    assert asked["ready"] and asked["blockers"] == []


def test_min_python_of_the_doctor_is_the_oldest_locked_python() -> None:
    from greta_install.doctor.checks.python import MIN_PYTHON

    # the fix a too-old Python is given names a Python every lock row installs on
    oldest = min(tuple(int(p) for p in py.split(".")) for py in load_matrix().pythons)
    assert oldest == MIN_PYTHON
