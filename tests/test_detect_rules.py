"""Detection rules on made-up machines: primary choice, env fixes, tool policy."""

from __future__ import annotations

from fake_view import FakeView

from greta_install.detection.detect import detect

NODES = "/sys/class/kfd/kfd/topology/nodes"


def _kfd_node(gfx_version: int, device_id: int, location: int, simd: int = 96) -> str:
    return (
        f"simd_count {simd}\nsimd_per_cu 2\ngfx_target_version {gfx_version}\n"
        f"vendor_id 4098\ndevice_id {device_id}\nlocation_id {location}\ndomain 0\n"
    )


def _drm(card: str, device: str, bus: str, vram: int) -> dict[str, str]:
    base = f"/sys/class/drm/{card}/device"
    return {
        f"{base}/vendor": "0x1002\n",
        f"{base}/device": f"{device}\n",
        f"{base}/mem_info_vram_total": f"{vram}\n",
        f"{base}/uevent": f"DRIVER=amdgpu\nPCI_SLOT_NAME={bus}\n",
    }


def _igpu_plus_dgpu(env: dict[str, str] | None = None) -> FakeView:
    files = {
        f"{NODES}/0/properties": "simd_count 0\ncpu_cores_count 16\n",
        # Node 1: the Raphael iGPU (gfx1036) at 0e:00.0; node 2: an RX 7900 XTX at 03:00.0.
        f"{NODES}/1/properties": _kfd_node(100306, 0x164E, 0x0E00, simd=4),
        f"{NODES}/2/properties": _kfd_node(110000, 0x744C, 0x0300),
        **_drm("card0", "0x744c", "0000:03:00.0", 24 * 2**30),
        **_drm("card1", "0x164e", "0000:0e:00.0", 512 * 2**20),
    }
    return FakeView(files=files, env=env)


def test_discrete_gpu_preferred_and_igpu_hidden() -> None:
    det = detect(_igpu_plus_dgpu())
    assert [g.arch for g in det.gpus] == ["gfx1036", "gfx1100"]
    assert det.primary == 1 and det.target == "radeon"
    assert det.gpus[0].integrated and not det.gpus[1].integrated
    assert det.gpus[1].evidence == ("kfd", "drm") and det.gpus[1].vram_bytes == 24 * 2**30
    # KFD order is the runtime's device order: device 1 is the discrete GPU.
    assert det.env == {"ROCR_VISIBLE_DEVICES": "1"}
    assert any(w.startswith("skipped GPU 0") and "integrated" in w for w in det.warnings)


def test_user_visibility_setting_is_respected_and_mentioned() -> None:
    det = detect(_igpu_plus_dgpu({"HIP_VISIBLE_DEVICES": "1"}))
    assert "ROCR_VISIBLE_DEVICES" not in det.env
    assert any("HIP_VISIBLE_DEVICES=1" in w for w in det.warnings)
    assert len(det.gpus) == 2  # visibility variables never drop GPUs from the report


def test_phoenix_apu_never_gets_an_automatic_override() -> None:
    view = FakeView(files={f"{NODES}/1/properties": _kfd_node(110003, 0x15BF, 0xC400, simd=24)})
    det = detect(view)
    assert det.arch == "gfx1103" and det.target == "radeon" and det.gpus[0].integrated
    # Public reports: page faults and system hangs. The install plan picks the native row.
    assert det.env == {}
    assert any("never sets it" in w and "native gfx1103" in w for w in det.warnings)


def test_needless_override_is_flagged() -> None:
    view = FakeView(
        files={f"{NODES}/1/properties": _kfd_node(110000, 0x744C, 0x0300)},
        env={"HSA_OVERRIDE_GFX_VERSION": "10.3.0"},
    )
    det = detect(view)
    assert det.env == {} and det.env_seen == {"HSA_OVERRIDE_GFX_VERSION": "10.3.0"}
    assert any("needs no override" in w for w in det.warnings)


def test_wrong_override_is_flagged() -> None:
    view = FakeView(
        files={f"{NODES}/1/properties": _kfd_node(100301, 0x73DF, 0x0300, simd=80)},
        env={"HSA_OVERRIDE_GFX_VERSION": "11.0.0"},
    )
    det = detect(view)
    # Whether 10.3.0 is needed depends on the torch wheels (the plan decides); the wrong
    # value is flagged here.
    assert det.env == {}
    assert any("can only run as gfx1030 (10.3.0)" in w for w in det.warnings)


def test_no_gpu_is_cpu() -> None:
    det = detect(FakeView())
    assert det.target == "cpu" and det.primary is None and det.gpus == []
    assert set(det.sources.values()) == {"absent"}


def test_nvidia_csv_and_cuda_visible_devices() -> None:
    csv = (
        "0, NVIDIA H100 80GB HBM3, 00000000:18:00.0, 0x233010DE, 9.0, 565.57.01, 81559 MiB\n"
        "1, NVIDIA H100 80GB HBM3, 00000000:2A:00.0, 0x233010DE, 9.0, 565.57.01, 81559 MiB\n"
    )
    view = FakeView(tools={"nvidia-smi": csv}, env={"CUDA_VISIBLE_DEVICES": ""})
    det = detect(view)
    assert det.target == "cuda" and det.arch == "sm_90" and det.driver_version == "565.57.01"
    assert any("hides every GPU" in w for w in det.warnings)


def test_live_view_skips_slow_tools_when_sysfs_is_enough() -> None:
    view = FakeView(
        files={f"{NODES}/1/properties": _kfd_node(90402, 0x74A1, 0x2600, simd=1216)},
        tools={"rocminfo": "never read", "rocm-smi": "never read"},
        is_live=True,
    )
    det = detect(view)
    assert det.arch == "gfx942"
    assert "rocminfo" not in view.ran and "amd-smi" not in view.ran and "rocm-smi" not in view.ran
    assert det.sources["rocminfo"].startswith("skipped")
    detect(view, tools="all")
    assert "rocminfo" in view.ran


def test_live_view_runs_rocminfo_when_sysfs_cannot_tell() -> None:
    # An id missing from the PCI table on an old kernel: only the tools can tell.
    view = FakeView(
        files={
            f"{NODES}/1/properties": "simd_count 64\nvendor_id 4098\ndevice_id 4660\nlocation_id 768\n"
        },
        tools={
            "rocminfo": "*******\nAgent 2\n*******\n  Name: gfx1101\n  Device Type: GPU\n  BDFID: 768\n"
        },
        is_live=True,
    )
    det = detect(view)
    assert "rocminfo" in view.ran
    assert det.arch == "gfx1101" and det.gpus[0].evidence == ("kfd", "rocminfo")


def test_unknown_amd_device_is_cpu_with_advice() -> None:
    view = FakeView(
        files={f"{NODES}/1/properties": "simd_count 64\nvendor_id 4098\ndevice_id 4660\n"}
    )
    det = detect(view)
    assert det.target == "cpu" and det.arch is None
    assert any("greta snapshot" in w for w in det.warnings)


def test_krackan_warns_that_wheels_lack_it() -> None:
    view = FakeView(files={f"{NODES}/1/properties": _kfd_node(110502, 0x1114, 0xC400, simd=16)})
    det = detect(view)
    assert det.arch == "gfx1152" and det.target == "radeon" and det.env == {}
    assert any("gfx1152 (Krackan Point) has no code in the classic" in w for w in det.warnings)
