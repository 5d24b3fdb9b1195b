"""Unit tests per parser, with small inline samples of each tool's output."""

from __future__ import annotations

from conftest import SNAPSHOTS

from greta_install import archs
from greta_install.detection import pci_ids
from greta_install.detection.parsers import (
    amd_smi,
    drm,
    kfd,
    lspci,
    nvidia_proc,
    nvidia_smi,
    rocm_smi,
    rocm_version,
    rocminfo,
)
from greta_install.detection.parsers.common import bus_from_location, clean, pci_bus

KFD_GPU = """\
cpu_cores_count 0
simd_count 192
simd_per_cu 2
gfx_target_version 110000
vendor_id 4098
device_id 29772
location_id 34304
domain 0
num_xcc 1
"""


def test_kfd_gpu_node() -> None:
    result = kfd.parse(KFD_GPU, "1", "gfx1100\n", "12345\n")
    assert result.problems == []
    (node,) = result.records
    assert node.is_gpu and node.gfx == "gfx1100" and node.device_id == "0x744c"
    assert node.pci_bus == "0000:86:00.0" and node.compute_units == 96
    assert node.name == "gfx1100" and node.gpu_id == 12345


def test_kfd_cpu_node_and_bad_value() -> None:
    result = kfd.parse("simd_count 0\ngfx_target_version 0\ndrm_render_minor {x}\n", "0")
    assert not result.records[0].is_gpu
    assert result.records[0].gfx is None
    assert "drm_render_minor" in result.problems[0]


def test_gfx_from_target_version() -> None:
    assert kfd.gfx_from_target_version(90402) == "gfx942"
    assert kfd.gfx_from_target_version(90010) == "gfx90a"
    assert kfd.gfx_from_target_version(110501) == "gfx1151"
    assert kfd.gfx_from_target_version(120001) == "gfx1201"
    assert kfd.gfx_from_target_version(0) is None
    assert kfd.gfx_from_target_version(91600) is None


def test_drm_card() -> None:
    files = {
        "vendor": "0x1002\n",
        "device": "0x15bf\n",
        "revision": "0xc4\n",
        "mem_info_vram_total": "536870912\n",
        "mem_info_gtt_total": "16777216000\n",
        "uevent": "DRIVER=amdgpu\nPCI_ID=1002:15BF\nPCI_SLOT_NAME=0000:c4:00.0\n",
    }
    (card,) = drm.parse_card("card1", files).records
    assert (card.vendor_id, card.device_id, card.revision) == (0x1002, "0x15bf", 0xC4)
    assert card.pci_bus == "0000:c4:00.0" and card.driver == "amdgpu"
    assert card.vram_bytes == 512 * 2**20 and card.gtt_bytes == 16777216000


def test_drm_card_ids_from_uevent_only() -> None:
    result = drm.parse_card("card0", {"uevent": "PCI_ID=10DE:2684\n", "vendor": "junk"})
    assert result.records[0].device_id == "0x2684"
    assert any("vendor" in p for p in result.problems)


LSPCI = """\
0000:03:00.0 VGA compatible controller [0300]: Advanced Micro Devices, Inc. [AMD/ATI] Navi 22 [Radeon RX 6700/6700 XT/6750 XT / 6800M/6850M XT] [1002:73df] (rev c1)
\tSubsystem: Sapphire Technology Limited Device [1da2:e445]
\tKernel driver in use: amdgpu
\tKernel modules: amdgpu
0000:03:00.1 Audio device [0403]: Advanced Micro Devices, Inc. [AMD/ATI] Navi 21/23 HDMI/DP Audio Controller [1002:ab28]
0000:00:01.1 PCI bridge [0604]: Advanced Micro Devices, Inc. [AMD] Device [1022:14ab]
0000:01:00.0 VGA compatible controller [0300]: NVIDIA Corporation AD102 [GeForce RTX 4090] [10de:2684] (rev a1)
\tKernel modules: nouveau, nvidia
"""


def test_lspci_devices_and_drivers() -> None:
    result = lspci.parse(LSPCI)
    assert result.problems == []
    gpus = [d for d in result.records if d.is_gpu]
    assert [g.device_id for g in gpus] == ["0x73df", "0x2684"]
    amd, nv = gpus
    assert amd.slot == "0000:03:00.0" and amd.revision == 0xC1 and amd.driver == "amdgpu"
    assert amd.name.startswith("Navi 22")
    assert nv.driver is None and nv.modules == ("nouveau", "nvidia")
    assert len(result.records) == 4


def test_lspci_without_ids_is_a_problem() -> None:
    result = lspci.parse("03:00.0 VGA compatible controller: Advanced Micro Devices Navi 22\n")
    assert result.records == [] and "-nn" in result.problems[0]


ROCMINFO = """\
\x1b[37mROCk module is loaded\x1b[0m
Runtime Version:         1.14
*******
Agent 1
*******
  Name:                    AMD Ryzen 9 7950X
  Device Type:             CPU
*******
Agent 2
*******
  Name:                    gfx1100
  Marketing Name:          AMD Radeon RX 7900 XTX
  Vendor Name:             AMD
  Device Type:             GPU
  Chip ID:                 29772(0x744c)
  BDFID:                   768
  Compute Unit:            96
  Node:                    1
  Memory Properties:
  ISA Info:
    ISA 1
      Name:                    amdgcn-amd-amdhsa--gfx1100
*******
Agent 3
*******
  Name:                    gfx1036
  Marketing Name:          AMD Radeon Graphics
  Device Type:             GPU
  Chip ID:                 5710(0x164e)
  BDFID:                   4352
  Memory Properties:       APU
"""


def test_rocminfo_agents() -> None:
    result = rocminfo.parse(ROCMINFO)
    assert result.problems == [] and result.info["runtime_version"] == "1.14"
    cpu, dgpu, igpu = result.records
    assert cpu.device_type == "CPU" and cpu.pci_bus is None
    assert (dgpu.gfx, dgpu.chip_id, dgpu.pci_bus, dgpu.compute_units) == (
        "gfx1100",
        "0x744c",
        "03:00.0",
        96,
    )
    assert igpu.apu and igpu.gfx == "gfx1036" and igpu.pci_bus == "11:00.0"


def test_rocminfo_error_is_reported_as_tool_error() -> None:
    result = rocminfo.parse("ROCk module is loaded\nhsa api call failure at: rocminfo.cc:1142\n")
    assert result.records == [] and "hsa api call failure" in result.errors[0]


ROCM_SMI_KV = """\
============================ ROCm System Management Interface ============================
Driver version: 6.7.0
GPU[0]\t\t: Device ID: 0x74a1
GPU[0]\t\t: Device Rev: 0x0
GPU[0]\t\t: PCI Bus: 0000:26:00.0
GPU[0]\t\t: Card series: \t\tAMD Instinct MI300X OAM
GPU[0]\t\t: GFX Version: \t\tgfx942
GPU[1]\t\t: Device ID: 0x74a1
"""

ROCM_SMI_CONCISE = """\
Device  Node  IDs              Temp    Power   Partitions          SCLK
              (DID,     GUID)  (Edge)  (Avg)   (Mem, Compute, ID)
0       1     0x73df,   61797  65.0°C  187.0W  N/A, N/A, 0         2585Mhz
"""

ROCM_SMI_SHOWHW = """\
GPU  NODE  DID     GUID   GFX VER  GFX RAS  SDMA RAS  UMC RAS  VBIOS  BUS           PARTITION ID
0    1     0x13c0  4729   gfx1036  N/A      N/A       N/A      N/A    0000:0E:00.0  0
"""


def test_rocm_smi_key_value() -> None:
    result = rocm_smi.parse(ROCM_SMI_KV)
    assert result.info["driver_version"] == "6.7.0"
    first, second = result.records
    assert (first.device_id, first.pci_bus, first.gfx) == ("0x74a1", "0000:26:00.0", "gfx942")
    assert first.product == "AMD Instinct MI300X OAM"
    assert second.index == 1 and second.pci_bus is None


def test_rocm_smi_tables() -> None:
    (concise,) = rocm_smi.parse(ROCM_SMI_CONCISE).records
    assert (concise.device_id, concise.node, concise.gfx) == ("0x73df", 1, None)
    (hw,) = rocm_smi.parse(ROCM_SMI_SHOWHW).records
    assert (hw.device_id, hw.gfx, hw.pci_bus) == ("0x13c0", "gfx1036", "0000:0e:00.0")


AMD_SMI = """\
CPU: 0
    SMU:
        FW_VERSION: 85.90.0

GPU: 0
    ASIC:
        MARKET_NAME: MI300X-O
        DEVICE_ID: 0x74a1
        REV_ID: 0x00
    BUS:
        BDF: 0000:0c:00.0
    DRIVER:
        NAME: amdgpu
        VERSION: 6.10.5
    BOARD:
        PRODUCT_NAME: AMD Instinct MI300X OAM
    PARTITION:
        COMPUTE_PARTITION: CPX
    VRAM:
        SIZE: 196592 MB
    TARGET_GRAPHICS_VERSION: gfx942
"""


def test_amd_smi_static() -> None:
    result = amd_smi.parse(AMD_SMI)
    (gpu,) = result.records
    assert (gpu.device_id, gpu.pci_bus, gpu.gfx) == ("0x74a1", "0000:0c:00.0", "gfx942")
    assert gpu.driver_name == "amdgpu" and gpu.driver_version == "6.10.5"
    assert gpu.market_name == "MI300X-O" and gpu.compute_partition == "CPX"
    assert gpu.vram_bytes == 196592 * 2**20


def test_nvidia_smi_csv() -> None:
    text = "0, NVIDIA H100 80GB HBM3, 00000000:18:00.0, 0x233010DE, 9.0, 565.57.01, 81559 MiB\n"
    result = nvidia_smi.parse(text)
    (gpu,) = result.records
    assert (gpu.device_id, gpu.compute_cap, gpu.pci_bus) == ("0x2330", "9.0", "0000:18:00.0")
    assert gpu.memory_mib == 81559 and result.info["driver_version"] == "565.57.01"


def test_nvidia_smi_csv_garbage_line() -> None:
    result = nvidia_smi.parse(
        "0, NVIDIA A100, 00000000:07:00.0, 0x20B010DE, 8.0, 550.1, 40960 MiB\nxx\n"
    )
    assert len(result.records) == 1 and "line 2" in result.problems[0]


def test_nvidia_smi_failure_message() -> None:
    msg = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"
    result = nvidia_smi.parse(msg)
    assert result.records == [] and "NVIDIA-SMI has failed" in result.errors[0]


def test_nvidia_smi_table_row() -> None:
    text = (
        "| NVIDIA-SMI 560.35.03   Driver Version: 560.35.03   CUDA Version: 12.6 |\n"
        "|   0  NVIDIA GeForce RTX 3090        On  |   00000000:41:00.0 Off |   N/A |\n"
        "| 30%   30C    P8   30W /  350W |       2MiB /  24576MiB |  0%  Default |\n"
    )
    result = nvidia_smi.parse(text)
    (gpu,) = result.records
    assert gpu.name == "NVIDIA GeForce RTX 3090" and gpu.memory_mib == 24576
    assert result.info == {"driver_version": "560.35.03", "cuda_version": "12.6"}


def test_nvidia_proc_version() -> None:
    closed = (
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  565.57.01  Thu Oct 10 12:29:05 UTC 2024\n"
    )
    opened = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build\n"
    assert nvidia_proc.parse(closed).records == ["565.57.01"]
    assert nvidia_proc.parse(opened).records == ["570.86.15"]
    assert nvidia_proc.parse("hello\n").problems


def test_rocm_versions() -> None:
    assert rocm_version.parse_info_version("6.4.1-120\n").records == ["6.4.1"]
    assert rocm_version.parse_info_version("garbage").problems
    assert rocm_version.parse_hipconfig("6.4.43484-123eb5128").records == ["6.4"]


def test_common_helpers() -> None:
    assert clean("\x1b[37mROCk\x1b[0m\r\n") == "ROCk\n"
    assert pci_bus("00000000:18:00.0") == "0000:18:00.0"
    assert pci_bus("c5:00.0") == "c5:00.0"
    assert bus_from_location(9728) == "26:00.0"
    assert bus_from_location(0) is None


def test_pci_table() -> None:
    assert pci_ids.lookup("0x74A1").gfx == "gfx942"  # type: ignore[union-attr]
    info = pci_ids.lookup(29663, revision=0xC1)
    assert info is not None and info.product == "AMD Radeon RX 6700 XT" and info.gfx == "gfx1031"
    krackan = pci_ids.lookup("1114")
    assert krackan is not None and krackan.gfx == "gfx1152" and "gfx1151" in (krackan.note or "")
    assert pci_ids.lookup("0xffff") is None
    assert all(r.gfx and r.gfx.startswith("gfx") for r in pci_ids.rows())


def test_arch_facts() -> None:
    assert archs.target_for_gfx("gfx942") == "mi300x"
    assert archs.target_for_gfx("gfx90a") == "instinct"
    assert archs.target_for_gfx("gfx1151") == "radeon"
    assert archs.target_for_gfx("gfx906") is None
    assert archs.wave_size("gfx942") == 64 and archs.wave_size("gfx1100") == 32
    assert archs.hsa_override("gfx1032").value == "10.3.0"  # type: ignore[union-attr]
    # gfx1103: the override is known (11.0.0) but never set automatically.
    assert archs.hsa_override("gfx1103") is None
    assert archs.known_override("gfx1103") == "11.0.0"
    assert "hang" in (archs.arch_facts("gfx1103").warning or "")
    assert archs.hsa_override("gfx1151") is None and archs.hsa_override("gfx1100") is None
    assert archs.override_to_gfx("10.3.0") == "gfx1030"
    assert archs.sm_from_compute_cap("12.0") == "sm_120"
    assert archs.sm_from_name("NVIDIA A100-SXM4-80GB") == "sm_80"
    assert archs.sm_from_name("Quadro RTX 5000") == "sm_75"
    assert archs.sm_from_name("NVIDIA RTX 5000 Ada Generation") == "sm_89"
    assert archs.sm_from_name("Mystery GPU", "Hopper") == "sm_90"
    assert archs.sm_from_name("Mystery GPU", "Ampere") is None


LSPCI_NAMES_ONLY = """\
03:00.0 VGA compatible controller: Advanced Micro Devices, Inc. [AMD/ATI] Navi 31 [Radeon RX 7900 XT/7900 XTX/7900M] (rev c8)
c4:00.0 Display controller: Advanced Micro Devices, Inc. [AMD/ATI] Phoenix1 (rev c4)
85:00.0 Processing accelerators: Advanced Micro Devices, Inc. [AMD/ATI] Aqua Vanjaram [Instinct MI300X]
01:00.0 VGA compatible controller: NVIDIA Corporation GA102 [GeForce RTX 3090] (rev a1)
00:14.0 USB controller: Intel Corporation Device 7ae0
"""


def test_lspci_without_nn_still_finds_amd_gpus_whose_name_identifies_them() -> None:
    from greta_install.detection import pci_ids

    result = lspci.parse(LSPCI_NAMES_ONLY)
    got = {d.slot: (d.device_id, d.class_code) for d in result.records}
    assert got == {
        "03:00.0": ("0x744c", "0300"),
        "c4:00.0": ("0x15bf", "0380"),
        "85:00.0": ("0x74a1", "1200"),
    }
    assert [pci_ids.lookup(d.device_id).gfx for d in result.records] == [  # type: ignore[union-attr]
        "gfx1100",
        "gfx1103",
        "gfx942",
    ]
    # The NVIDIA line names no chip GRETA can map without ids: said, not guessed.
    assert len(result.problems) == 1 and "line 4" in result.problems[0]


def test_detection_from_lspci_without_nn() -> None:
    from fake_view import FakeView

    from greta_install.detection.detect import detect

    det = detect(FakeView(tools={"lspci": LSPCI_NAMES_ONLY.splitlines()[0] + "\n"}))
    assert det.target == "radeon" and det.arch == "gfx1100"


def test_lspci_iommu_group_listings_are_device_lines() -> None:
    # The VFIO scripts' two forms: "IOMMU Group N:" over tab-indented `lspci -nns` lines
    # (a real paste, SOURCES.txt), and one "IOMMU Group N <line>" per device (the Arch wiki
    # script's form). An indented detail line after a device is still that device's detail.
    grouped = (SNAPSHOTS / "rx6700xt-gtx970-lspci-iommu" / "lspci.txt").read_text()
    result = lspci.parse(grouped)
    assert result.problems == []
    assert [(d.slot, d.device_id, d.is_gpu) for d in result.records] == [
        ("0d:00.0", "0x73df", True),
        ("0d:00.1", "0xab28", False),
        ("0e:00.0", "0x13c2", True),
        ("0e:00.1", "0x0fbb", False),
    ]
    one_line = (
        "IOMMU Group 29 0b:00.0 VGA compatible controller [0300]: NVIDIA Corporation GK208B "
        "[GeForce GT 710] [10de:128b] (rev a1)\n"
        "\tKernel driver in use: vfio-pci\n"
    )
    (dev,) = lspci.parse(one_line).records
    assert (dev.slot, dev.device_id, dev.driver) == ("0b:00.0", "0x128b", "vfio-pci")
