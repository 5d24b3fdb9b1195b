"""Every real-machine snapshot is classified as its expected.json says."""

from __future__ import annotations

import json

import pytest
from conftest import SNAPSHOTS, load_expected, snapshot_names

from greta_install.detection.detect import detect
from greta_install.detection.system_view import SnapshotSystem
from greta_install.model import TARGETS, Detection


def _detect(name: str) -> Detection:
    return detect(SnapshotSystem(SNAPSHOTS / name))


def test_there_are_snapshots() -> None:
    assert len(snapshot_names()) >= 16


@pytest.mark.parametrize("name", snapshot_names())
def test_snapshot_matches_expected(name: str) -> None:
    expected = load_expected(name)
    det = _detect(name)
    assert det.target in TARGETS
    if "target" in expected:
        assert det.target == expected["target"], det.warnings
    if "arch" in expected:
        assert det.arch == expected["arch"], det.warnings
    if "amd_gpus" in expected:
        assert sum(g.vendor == "amd" for g in det.gpus) == expected["amd_gpus"]
    if "nvidia_gpus" in expected:
        assert sum(g.vendor == "nvidia" for g in det.gpus) == expected["nvidia_gpus"]
    if "env" in expected:
        assert det.env == expected["env"]
    if "state" in expected:
        assert det.state == expected["state"], det.warnings
    if "primary_bus" in expected:
        assert det.primary_gpu is not None
        assert det.primary_gpu.pci_bus == expected["primary_bus"], det.warnings
    if "evidence" in expected:
        assert [list(g.evidence) for g in det.gpus] == expected["evidence"]
    if "blocker_contains" in expected:
        assert any(expected["blocker_contains"] in b for b in det.blockers), det.blockers
    else:
        assert det.blockers == [] or det.state == "unusable"
    if "warning_contains" in expected:
        assert any(expected["warning_contains"] in w for w in det.warnings), det.warnings
    # Every snapshot's JSON is complete and serialisable.
    data = json.loads(json.dumps(det.to_json()))
    assert {
        "target",
        "primary",
        "gpus",
        "rocm_version",
        "driver_version",
        "env",
        "warnings",
    } <= set(data)
    for gpu in data["gpus"]:
        assert gpu["vendor"] in ("amd", "nvidia")
        assert gpu["evidence"], gpu
        assert gpu["pci_id"] is None or gpu["pci_id"].startswith("0x")


def test_pf_host_is_mi300x_but_not_usable() -> None:
    det = _detect("mi300x-pf-host")
    assert [g.pci_id for g in det.gpus] == ["0x74a1", "0x74b5"]
    assert not any(g.usable for g in det.gpus)
    text = " ".join(det.warnings)
    assert "gim" in text and "vfio-pci" in text
    assert "no GPU here is usable" in text


def test_vf_guest_is_a_usable_vf() -> None:
    det = _detect("mi300x-vf-guest")
    gpu = det.primary_gpu
    assert gpu is not None and gpu.usable and gpu.pci_id == "0x74b5"
    assert "virtual function" in (gpu.note or "")


def test_override_capture_reports_native_arch_and_why() -> None:
    det = _detect("rx6700xt-override")
    assert det.gpus[0].evidence == ("rocminfo", "rocm-smi")
    assert any("rocminfo reports gfx1030" in w and "gfx1031" in w for w in det.warnings)


def test_placeholder_line_is_tolerated_and_reported() -> None:
    det = _detect("rx7900xtx-mock-kfd")
    assert det.sources["kfd"].startswith("garbled:")
    assert any("drm_render_minor" in w for w in det.warnings)
    assert det.gpus[0].compute_units == 96


def test_old_kernel_arch_from_pci_table() -> None:
    det = _detect("vega10-oldkernel-kfd")
    assert det.arch == "gfx900" and det.gpus[0].pci_id == "0x6860"
    assert det.target == "cpu"
    assert any("GCN5" in w for w in det.warnings)


def test_cpx_partition_is_noted() -> None:
    for name in ("mi300x-cpx-kfd", "mi308x-cpx-kfd"):
        gpu = _detect(name).primary_gpu
        assert gpu is not None and "compute partition" in (gpu.note or "")


def test_strix_halo_is_integrated_and_needs_no_override() -> None:
    det = _detect("strix-halo")
    assert det.gpus[0].integrated
    assert det.gpus[0].evidence == ("rocminfo", "lspci")
    assert "HSA_OVERRIDE_GFX_VERSION" not in det.env


def test_nvidia_versions_from_table_and_query() -> None:
    for name in ("h100-x8", "h100-x8-q"):
        det = _detect(name)
        assert det.driver_version == "565.57.01"
        assert det.cuda_version == "12.7"
        assert len({g.pci_bus for g in det.gpus}) == 8


def test_mi300x_x4_merges_rocminfo_and_rocm_smi_by_bus() -> None:
    det = _detect("mi300x-x4")
    assert [g.pci_bus for g in det.gpus] == [
        "0000:26:00.0",
        "0000:46:00.0",
        "0000:65:00.0",
        "0000:85:00.0",
    ]
    assert all(g.evidence == ("rocminfo", "rocm-smi") for g in det.gpus)
    assert det.driver_version == "6.7.0"
