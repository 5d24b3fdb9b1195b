"""multi_gpu.* doctor checks on snapshots built from real public outputs (tests/data/snapshots,
sources in SOURCES.txt), plus the settings each check judges, varied one at a time."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from conftest import DATA, SNAPSHOTS
from fake_view import FakeView

from greta_install.detection.parsers.pcie import bridges_above, parse_lspci_vvv
from greta_install.detection.parsers.topology import (
    parse_amd_smi_topology,
    parse_nvidia_p2p,
    parse_nvidia_topo,
    parse_rocm_smi_topo,
)
from greta_install.detection.snapshot import write_snapshot
from greta_install.detection.system_view import SnapshotSystem
from greta_install.doctor.checks import CHECKS
from greta_install.doctor.checks import multi_gpu as mg
from greta_install.doctor.collect import collect_facts
from greta_install.doctor.facts import Facts
from greta_install.doctor.multi_gpu_facts import MultiGpuFacts
from greta_install.doctor.runner import run_check
from greta_install.model import Detection, Gpu

MULTI = DATA / "multi_gpu"
CHECK = {c.id: c for c in CHECKS}


def multi_gpu_snapshots() -> list[str]:
    return sorted(
        p.name
        for p in SNAPSHOTS.iterdir()
        if (p / "expected.json").is_file()
        and "multi_gpu" in json.loads((p / "expected.json").read_text())
    )


def facts_of(name: str, **changes: object) -> Facts:
    facts = collect_facts(SnapshotSystem(SNAPSHOTS / name))
    return dataclasses.replace(facts, **changes) if changes else facts


def with_texts(facts: Facts, **texts: str | None) -> Facts:
    raw = dataclasses.replace(facts.multi_gpu or MultiGpuFacts(), **texts)
    return dataclasses.replace(facts, multi_gpu=raw)


def status(check_id: str, facts: Facts) -> tuple[str, str, str | None]:
    result = run_check(CHECK[check_id], facts)
    assert not result.details.get("internal_error"), result.finding
    return result.status, result.finding, result.fix


def gpus(*products: str) -> Detection:
    return Detection(
        target="cuda" if "NVIDIA" in products[0] else "mi300x",
        primary=0,
        gpus=[
            Gpu(
                vendor="nvidia" if "NVIDIA" in p else "amd",
                arch=None,
                product=p,
                pci_id=None,
            )
            for p in products
        ],
    )


# --- every fixture snapshot concludes what its expected.json says -------------------------


def test_there_are_multi_gpu_snapshots() -> None:
    assert len(multi_gpu_snapshots()) >= 5


@pytest.mark.parametrize("name", multi_gpu_snapshots())
def test_snapshot_matches_expected(name: str) -> None:
    expected = json.loads((SNAPSHOTS / name / "expected.json").read_text())["multi_gpu"]
    facts = facts_of(name)
    assert mg.view_of(facts).count == expected["gpus"]
    for check_id, want in expected.items():
        if check_id.startswith("multi_gpu."):
            got, finding, _ = status(check_id, facts)
            assert got == want, f"{check_id}: {finding}"


def test_single_gpu_snapshot_skips_every_check_with_a_reason() -> None:
    facts = facts_of("rx6700xt-override", env={}, env_known=True)
    for check in CHECKS:
        if check.id.startswith("multi_gpu.") and check.id != "multi_gpu.visible_devices":
            got, finding, _ = status(check.id, facts)
            assert (got, finding) == ("skip", "one GPU: collectives between GPUs do not apply")


# --- parsers on the real outputs ---------------------------------------------------------------


def test_nvidia_topo_reads_links_and_numa_from_tab_separated_output() -> None:
    topo = parse_nvidia_topo(
        (SNAPSHOTS / "h100-x8-nvlink-topo" / "nvidia-smi-topo.txt").read_text()
    )
    assert topo is not None and topo.count == 8
    assert len(topo.pairs_of("nvlink")) == 28 and topo.raw[(0, 7)] == "NV18"
    assert topo.numa == {0: 0, 1: 0, 2: 0, 3: 0, 4: 1, 5: 1, 6: 1, 7: 1}


def test_nvidia_topo_reads_space_separated_copy() -> None:
    topo = parse_nvidia_topo(
        (SNAPSHOTS / "a100-x8-nvlink-pairs" / "nvidia-smi-topo.txt").read_text()
    )
    assert topo is not None
    assert topo.pairs_of("nvlink") == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert topo.raw[(0, 4)] == "SYS" and (0, 4) in topo.cross_socket()
    assert (0, 2) not in topo.cross_socket()  # NODE: same socket


def test_rocm_and_amd_smi_tables() -> None:
    rocm = parse_rocm_smi_topo(
        (SNAPSHOTS / "rocm-pcie-x4-showtopo" / "rocm-smi-topo.txt").read_text()
    )
    assert rocm is not None and rocm.count == 4 and set(rocm.kinds.values()) == {"pcie"}
    assert rocm.hops[(1, 2)] == 3
    amd = parse_amd_smi_topology(
        (SNAPSHOTS / "mi300x-x8-amdsmi-topology" / "amd-smi-topology.txt").read_text()
    )
    assert amd is not None and amd.gpus[0] == "0000:0c:00.0"
    assert len(amd.pairs_of("xgmi")) == 28 and amd.hops[(0, 1)] == 1


def test_p2p_matrix() -> None:
    text = (SNAPSHOTS / "rtx5090-x2-pcie" / "nvidia-smi-topo-p2p.txt").read_text()
    assert parse_nvidia_p2p(text) == {(0, 1): "GNS", (1, 0): "GNS"}


@pytest.mark.parametrize("text", ["", "garbage\n\x00\x01", "GPU0 GPU1\nnonsense", "NV18 NV18"])
def test_parsers_return_none_on_garbage(text: str) -> None:
    assert parse_nvidia_topo(text) is None
    assert parse_rocm_smi_topo(text) is None
    assert parse_amd_smi_topology(text) is None
    assert parse_lspci_vvv(text) == []


LSPCI_TREE = """\
0000:00:01.1 PCI bridge [0604]: Advanced Micro Devices, Inc. [AMD] Starship/Matisse GPP Bridge
\tBus: primary=00, secondary=01, subordinate=04, sec-latency=0
\tCapabilities: [2a0 v1] Access Control Services
\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-
0000:00:03.1 PCI bridge [0604]: Advanced Micro Devices, Inc. [AMD] Starship/Matisse GPP Bridge
\tBus: primary=00, secondary=05, subordinate=05, sec-latency=0
\tCapabilities: [2a0 v1] Access Control Services
\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-
0000:01:00.0 PCI bridge [0604]: PLX Technology, Inc. PEX 8747
\tBus: primary=01, secondary=02, subordinate=04, sec-latency=0
\tCapabilities: [f24 v1] Access Control Services
\t\tACSCtl:\tSrcValid- TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- DirectTrans-
0000:03:00.0 Processing accelerators [1200]: Advanced Micro Devices, Inc. [AMD/ATI] Arcturus GL-XL [Instinct MI100]
\tNUMA node: 0
0000:04:00.0 Processing accelerators [1200]: Advanced Micro Devices, Inc. [AMD/ATI] Arcturus GL-XL [Instinct MI100]
\tNUMA node: 0
"""


def test_lspci_bridges_above_a_gpu_by_bus_range() -> None:
    functions = parse_lspci_vvv(LSPCI_TREE)
    gpu = next(f for f in functions if f.bdf == "0000:03:00.0")
    assert [b.bdf for b in bridges_above(functions, gpu)] == ["0000:00:01.1", "0000:01:00.0"]
    assert gpu.is_gpu and gpu.numa_node == 0


def test_lspci_pp_paths_name_the_bridges() -> None:
    text = (
        "0000:00:01.1/01:00.0/02:00.0 Processing accelerators [1200]: AMD Instinct MI300X\n"
        "0000:00:01.1 PCI bridge [0604]: AMD GPP Bridge\n\t\tACSCtl:\tSrcValid-\n"
    )
    functions = parse_lspci_vvv(text)
    gpu = functions[0]
    assert gpu.upstream == ("0000:00:01.1", "0000:01:00.0")
    assert [b.bdf for b in bridges_above(functions, gpu)] == ["0000:00:01.1"]


# --- ACS ---------------------------------------------------------------------------------------------


def two_mi100() -> Facts:
    return Facts(live=False, detection=gpus("AMD Instinct MI100", "AMD Instinct MI100"))


def test_acs_on_the_bridge_posted_in_rccl_547_fails_with_setpci_fix() -> None:
    # The thread's `lspci -tv` shows two MI100 under 40:01.1; its ACSCtl has SrcValid+.
    text = (MULTI / "lspci-vvv-rccl547-acs.txt").read_text()
    got, finding, fix = status("multi_gpu.acs", with_texts(two_mi100(), lspci_vvv=text))
    assert got == "fail" and "0000:40:01.1" in finding
    assert fix is not None and "setpci -s $b ECAP_ACS+6.w=0000" in fix and "40:01.1" in fix


def test_acs_judged_only_on_bridges_above_the_gpus() -> None:
    got, finding, _ = status("multi_gpu.acs", with_texts(two_mi100(), lspci_vvv=LSPCI_TREE))
    assert got == "fail" and "above the GPUs" in finding
    assert "0000:00:01.1" in finding and "0000:00:03.1" not in finding  # 03.1 leads elsewhere
    off = LSPCI_TREE.replace("SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+", "SrcValid-")
    assert status("multi_gpu.acs", with_texts(two_mi100(), lspci_vvv=off))[0] == "ok"


def test_acs_unreadable_without_root_is_a_skip_not_an_ok() -> None:
    text = "0000:00:01.1 PCI bridge: AMD GPP Bridge\n\tCapabilities: <access denied>\n"
    got, finding, _ = status("multi_gpu.acs", with_texts(two_mi100(), lspci_vvv=text))
    assert got == "skip" and "sudo" in finding


# --- IOMMU ------------------------------------------------------------------------------------------


def test_iommu_pt_from_rccl_1129_is_ok_and_its_before_state_warns_on_amd() -> None:
    after = (MULTI / "cmdline-rccl1129-iommu-pt.txt").read_text()
    before = after.replace(" iommu=pt", "")
    base = facts_of("rocm-pcie-x4-showtopo")
    assert status("multi_gpu.iommu", with_texts(base, cmdline=after))[0] == "ok"
    got, finding, fix = status("multi_gpu.iommu", with_texts(base, cmdline=before))
    assert got == "warn" and 'Missing "iommu=pt"' in finding
    assert fix is not None and "iommu=pt" in fix and "update-grub" in fix


def test_iommu_on_nvidia_warns_only_when_translation_is_requested() -> None:
    base = facts_of("h100-x8-nvlink-topo")
    plain = "BOOT_IMAGE=/vmlinuz-5.15.0-101-generic root=/dev/mapper/ubuntu--vg-ubuntu--lv ro"
    assert status("multi_gpu.iommu", with_texts(base, cmdline=plain))[0] == "ok"
    got, finding, _ = status("multi_gpu.iommu", with_texts(base, cmdline=plain + " intel_iommu=on"))
    assert got == "warn" and "intel_iommu=on" in finding


# --- fine-grain PCIe, P2P, links --------------------------------------------------------------------


def test_fine_grain_over_pcie_depends_on_the_variable() -> None:
    base = facts_of("rocm-pcie-x4-showtopo", env_known=True, env={})
    got, _, fix = status("multi_gpu.fine_grain", base)
    assert got == "warn" and fix == "export HSA_FORCE_FINE_GRAIN_PCIE=1"
    set_ = dataclasses.replace(base, env={"HSA_FORCE_FINE_GRAIN_PCIE": "1"})
    assert status("multi_gpu.fine_grain", set_)[0] == "ok"


def test_p2p_disabled_on_xgmi_warns_and_gns_pair_needs_nothing() -> None:
    xgmi = facts_of("mi300x-x8-amdsmi-topology", env_known=True, env={"NCCL_P2P_DISABLE": "1"})
    got, _, fix = status("multi_gpu.p2p", xgmi)
    assert got == "warn" and fix == "unset NCCL_P2P_DISABLE"
    rtx = facts_of("rtx5090-x2-pcie", env_known=True, env={})
    got, finding, _ = status("multi_gpu.p2p", rtx)
    assert got == "ok" and "GNS" in finding


def test_consumer_pair_with_p2p_allowed_is_told_how_to_test_and_disable() -> None:
    rtx = facts_of("rtx5090-x2-pcie", env_known=True, env={})
    ok_matrix = " \tGPU0\tGPU1\n GPU0\tX\tOK\n GPU1\tOK\tX\n"
    facts = with_texts(
        dataclasses.replace(
            rtx, detection=gpus("NVIDIA GeForce RTX 5090", "NVIDIA GeForce RTX 5090")
        ),
        nvidia_p2p=ok_matrix,
    )
    got, _, fix = status("multi_gpu.p2p", facts)
    assert got == "warn" and fix is not None and "NCCL_P2P_DISABLE=1" in fix


def _amd_smi_first(n: int) -> str:
    """The real 8-GPU amd-smi LINK TYPE table cut to its first n GPUs."""
    lines = (SNAPSHOTS / "mi300x-x8-amdsmi-topology" / "amd-smi-topology.txt").read_text()
    block = lines.split("LINK TYPE TABLE:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    header, rows = block[0].split()[:n], [row.split()[: n + 1] for row in block[1 : n + 1]]
    cut = [" " * 13 + " ".join(header)] + [" ".join(row) for row in rows]
    return "LINK TYPE TABLE:\n" + "\n".join(cut) + "\n"


def test_fewer_than_eight_mi300x_use_a_fraction_of_xgmi() -> None:
    four = facts_of("mi300x-x4")  # a real 4x MI300X machine (rocminfo + rocm-smi)
    got, finding, _ = status("multi_gpu.links", with_texts(four, amd_topology=_amd_smi_first(4)))
    assert got == "warn" and "3/7" in finding
    eight = with_texts(
        dataclasses.replace(four, detection=gpus(*["AMD Instinct MI300X"] * 8)),
        amd_topology=_amd_smi_first(8),
    )
    assert status("multi_gpu.links", eight)[0] == "ok"


def test_nvlink_board_reporting_pcie_only_fails() -> None:
    h100 = facts_of("h100-x8")  # real nvidia-smi of 8x "NVIDIA H100 80GB HBM3"
    topo = (SNAPSHOTS / "h100-x8-nvlink-topo" / "nvidia-smi-topo.txt").read_text()
    got, _, fix = status(
        "multi_gpu.links", with_texts(h100, nvidia_topo=topo.replace("NV18", "SYS"))
    )
    assert got == "fail" and fix is not None and "nvidia-fabricmanager" in fix
    assert status("multi_gpu.links", with_texts(h100, nvidia_topo=topo))[0] == "ok"


# --- NUMA ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "want"), [("1", "warn"), ("2", "warn"), ("0", "ok")])
def test_numa_balancing(value: str, want: str) -> None:
    facts = with_texts(facts_of("mi300x-x8-amdsmi-topology"), numa_balancing=value)
    got, _, fix = status("multi_gpu.numa_balancing", facts)
    assert got == want
    assert (fix is not None and "kernel.numa_balancing=0" in fix) == (want == "warn")


def test_gpus_without_numa_node_on_a_two_node_machine() -> None:
    topo = (SNAPSHOTS / "rtx5090-x2-pcie" / "nvidia-smi-topo.txt").read_text()
    no_node = topo.replace("0-63\t0\t", "0-63\tN/A\t")
    facts = with_texts(facts_of("rtx5090-x2-pcie"), nvidia_topo=no_node, numa_online="0-1")
    got, finding, _ = status("multi_gpu.numa_placement", facts)
    assert got == "warn" and "2-node" in finding


# --- visible-devices variables ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "want", "words"),
    [
        ({}, "ok", "every GPU is visible"),
        ({"HIP_VISIBLE_DEVICES": "0,1", "CUDA_VISIBLE_DEVICES": "0,1"}, "ok", "consistent"),
        ({"HIP_VISIBLE_DEVICES": "0,1", "CUDA_VISIBLE_DEVICES": "2,3"}, "fail", "disagree"),
        ({"HIP_VISIBLE_DEVICES": "4"}, "fail", "invalid device ordinal"),
        ({"ROCR_VISIBLE_DEVICES": "2,3", "HIP_VISIBLE_DEVICES": "1"}, "ok", "consistent"),
        ({"ROCR_VISIBLE_DEVICES": "2,3", "HIP_VISIBLE_DEVICES": "2"}, "fail", "only 2 are visible"),
        ({"ROCR_VISIBLE_DEVICES": "7"}, "fail", "names GPU 7 of 4"),
        ({"HIP_VISIBLE_DEVICES": "0,0"}, "fail", "twice"),
        ({"HIP_VISIBLE_DEVICES": ""}, "fail", "hides every GPU"),
    ],
)
def test_visible_devices_on_four_gpus(env: dict[str, str], want: str, words: str) -> None:
    facts = facts_of("rocm-pcie-x4-showtopo", env_known=True, env=env)
    got, finding, fix = status("multi_gpu.visible_devices", facts)
    assert got == want and words in finding
    assert (fix is not None) == (want == "fail")


def test_visible_devices_on_nvidia_ignore_rocm_variables() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "8", "HIP_VISIBLE_DEVICES": "3"}
    got, finding, _ = status(
        "multi_gpu.visible_devices", facts_of("h100-x8-nvlink-topo", env_known=True, env=env)
    )
    assert got == "fail" and "CUDA_VISIBLE_DEVICES=8" in finding and "HIP" not in finding


# --- the snapshot records what the checks read --------------------------------------------------


def test_snapshot_records_multi_gpu_inputs_and_redacts_disk_ids(tmp_path: Path) -> None:
    nv_topo = (SNAPSHOTS / "a100-x8-nvlink-pairs" / "nvidia-smi-topo.txt").read_text()
    view = FakeView(
        files={
            "/proc/cmdline": "BOOT_IMAGE=/vmlinuz root=UUID=1234-abcd ro quiet\n",
            "/proc/sys/kernel/numa_balancing": "1\n",
            "/sys/devices/system/node/online": "0-1\n",
        },
        tools={"nvidia-smi-topo": nv_topo},
        env={"CUDA_VISIBLE_DEVICES": "0,1", "NCCL_P2P_DISABLE": "1"},
    )
    files = write_snapshot(view, tmp_path / "snap")
    assert {"proc/cmdline", "proc/sys/kernel/numa_balancing", "nvidia-smi-topo.txt"} <= set(files)
    assert "1234-abcd" not in (tmp_path / "snap" / "proc" / "cmdline").read_text()
    facts = collect_facts(SnapshotSystem(tmp_path / "snap"))
    assert facts.env["NCCL_P2P_DISABLE"] == "1"
    assert status("multi_gpu.numa_balancing", facts)[0] == "warn"
    assert status("multi_gpu.links", facts)[0] == "warn"
    assert status("multi_gpu.iommu", facts)[0] == "ok"


def test_four_mi300a_apus_are_not_told_to_use_eight() -> None:
    four = with_texts(
        facts_of("mi300a-x4-amdsmi"),  # real amd-smi static of a 4x MI300A node
        amd_topology=_amd_smi_first(4),
    )
    got, finding, _ = status("multi_gpu.links", four)
    assert got == "ok" and "XGMI" in finding
