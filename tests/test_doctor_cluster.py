"""`greta doctor --cluster`: the node record read from sysfs/procfs trees (fixtures), the
parsers of NCCL's selector syntax and of Slurm's environment, and each cluster finding with
its fix on records that carry one planted fault."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from greta_install.detection.system_view import SnapshotSystem
from greta_install.doctor.cluster import cluster_findings
from greta_install.doctor.cluster_facts import (
    OverlayView,
    collect_nics,
    collect_rdma,
    collect_record,
    collect_shm,
    nvidia_driver,
    parse_selector,
    rendezvous_env,
    select,
    shm_from_mounts,
    slurm_first_host,
)
from greta_install.doctor.collective import (
    JobRun,
    default_gate,
    gate_rows,
    judge_job,
    local_link,
    rdma_gbits,
)
from greta_install.doctor.collective_run import in_job, parse_sizes
from greta_install.doctor.collective_worker import judge_stall

ROOT = Path(__file__).resolve().parents[1]
GiB = 2**30
ROCE_GIDS = {  # a ConnectX port on RoCE: link-local v1/v2, then the IPv4-mapped v1/v2
    0: ("fe80:0000:0000:0000:0a3b:4cff:fe5d:6e7f", "IB/RoCE v1"),
    1: ("fe80:0000:0000:0000:0a3b:4cff:fe5d:6e7f", "RoCE v2"),
    2: ("0000:0000:0000:0000:0000:ffff:0a00:0011", "IB/RoCE v1"),
    3: ("0000:0000:0000:0000:0000:ffff:0a00:0011", "RoCE v2"),
}


def _write(root: Path, path: str, text: str) -> None:
    where = root / path.lstrip("/")
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text(text + "\n")


def make_node(
    root: Path,
    *,
    shm: str = "16g",
    gids: dict[int, tuple[str, str]] | None = None,
    ib_state: str = "4: ACTIVE",
) -> Path:
    """A sysfs/procfs tree of a RoCE node: a 1 GbE management port, a 200 GbE data port."""
    _write(root, "/proc/mounts", f"tmpfs /dev/shm tmpfs rw,nosuid,nodev,size={shm} 0 0")
    for name, state, speed, kind, phys in (
        ("lo", "unknown", None, 772, False),
        ("eno1", "up", 1000, 1, True),
        ("ens1f0np0", "up", 200000, 1, True),
        ("docker0", "down", None, 1, False),
    ):
        _write(root, f"/sys/class/net/{name}/operstate", state)
        _write(root, f"/sys/class/net/{name}/flags", "0x1003" if state != "down" else "0x1002")
        _write(root, f"/sys/class/net/{name}/type", str(kind))
        _write(root, f"/sys/class/net/{name}/mtu", "9000")
        if speed:
            _write(root, f"/sys/class/net/{name}/speed", str(speed))
        if phys:
            _write(root, f"/sys/class/net/{name}/device/vendor", "0x15b3")
    port = "/sys/class/infiniband/mlx5_0/ports/1"
    _write(root, f"{port}/state", ib_state)
    _write(root, f"{port}/phys_state", "5: LinkUp")
    _write(root, f"{port}/link_layer", "Ethernet")
    _write(root, f"{port}/rate", "200 Gb/sec (4X HDR)")
    for index in range(8):
        gid, kind = (gids if gids is not None else ROCE_GIDS).get(index, ("0000:" * 7 + "0000", ""))
        _write(root, f"{port}/gids/{index}", gid)
        _write(root, f"{port}/gid_attrs/types/{index}", kind)
        _write(root, f"{port}/gid_attrs/ndevs/{index}", "ens1f0np0" if kind else "")
    _write(root, "/proc/cmdline", "BOOT_IMAGE=/vmlinuz root=UUID=1234-abcd ro iommu=pt")
    return root


def test_shm_size_from_the_mount_table() -> None:
    assert (
        shm_from_mounts("shm /dev/shm tmpfs rw,nosuid,nodev,noexec,relatime,size=65536k 0 0")
        == 64 * 2**20
    )
    assert shm_from_mounts("tmpfs /dev/shm tmpfs rw,size=16g 0 0") == 16 * GiB
    # Remounted: the last line is the mount in effect.
    two = "tmpfs /dev/shm tmpfs rw,size=64m 0 0\ntmpfs /dev/shm tmpfs rw,size=2g 0 0"
    assert shm_from_mounts(two) == 2 * GiB
    assert shm_from_mounts("tmpfs /dev/shm tmpfs rw,nosuid 0 0") is None  # kernel default
    assert shm_from_mounts("tmpfs /dev/shm tmpfs rw,size=50% 0 0") is None
    assert shm_from_mounts("tmpfs /run tmpfs rw,size=64m 0 0") is None


def test_nccl_selector_syntax() -> None:
    names = ["lo", "eno1", "ens1f0np0", "ens1f1np1", "docker0"]
    assert select(names, "ens") == ["ens1f0np0", "ens1f1np1"]
    assert select(names, "=ens1f0np0") == ["ens1f0np0"]
    assert select(names, "=ens1") == []
    assert select(names, "^docker,lo") == ["eno1", "ens1f0np0", "ens1f1np1"]
    assert select(names, "eth9") == []
    assert parse_selector("=mlx5_0:1,mlx5_1") == (False, True, [("mlx5_0", 1), ("mlx5_1", None)])
    assert parse_selector("^mlx5_2") == (True, False, [("mlx5_2", None)])


def test_rendezvous_from_torchrun_and_slurm() -> None:
    torchrun = {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "LOCAL_RANK": "1",
        "GROUP_RANK": "1",
    }
    assert rendezvous_env(torchrun) == {**torchrun}
    slurm = {
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "8",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "2",
        "SLURM_JOB_NODELIST": "gpu[03-05,07],cpu1",
        "MASTER_PORT": "29511",
    }
    assert rendezvous_env(slurm) == {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "GROUP_RANK": "2",
        "MASTER_ADDR": "gpu03",
        "MASTER_PORT": "29511",
    }
    assert "export MASTER_PORT" in str(rendezvous_env({**slurm, "MASTER_PORT": ""}))
    assert "MASTER_PORT" in str(
        rendezvous_env({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h"})
    )
    assert "torchrun" in str(rendezvous_env({}))
    assert slurm_first_host("node7") == "node7"


def test_driver_versions() -> None:
    text = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024"
    assert nvidia_driver(text) == "550.54.15"
    open_kernel = (
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build"
    )
    assert nvidia_driver(open_kernel) == "570.86.15"
    assert nvidia_driver(None) is None


def test_record_reads_nics_rdma_gids_and_shm_from_a_tree(tmp_path: Path) -> None:
    view = SnapshotSystem(make_node(tmp_path, shm="64m"))
    nics = {n["name"]: n for n in collect_nics(view)}
    assert nics["ens1f0np0"] == {
        "name": "ens1f0np0",
        "operstate": "up",
        "admin_up": True,
        "type": 1,
        "mtu": 9000,
        "speed_mbps": 200000,
        "physical": True,
    }
    assert nics["docker0"]["admin_up"] is False and nics["lo"]["physical"] is False
    (port,) = collect_rdma(view)
    assert (port["device"], port["port"], port["state"], port["link_layer"]) == (
        "mlx5_0",
        1,
        "ACTIVE",
        "Ethernet",
    )
    # Empty slots of the 8-entry table are left out; each GID keeps its type and netdev.
    assert [(g["index"], g["type"]) for g in port["gids"]] == [
        (0, "IB/RoCE v1"),
        (1, "RoCE v2"),
        (2, "IB/RoCE v1"),
        (3, "RoCE v2"),
    ]
    assert port["gids"][3]["ndev"] == "ens1f0np0"
    assert collect_shm(view) == {"path": "/dev/shm", "bytes": 64 * 2**20, "source": "/proc/mounts"}
    assert rdma_gbits([port]) == 200.0


def test_overlay_fixture_wins_over_the_base(tmp_path: Path) -> None:
    base = make_node(tmp_path / "base", shm="16g")
    over = tmp_path / "over"
    _write(over, "/proc/mounts", "shm /dev/shm tmpfs rw,size=65536k 0 0")
    _write(over, "/sys/class/net/ib0/operstate", "down")
    view = OverlayView(over, SnapshotSystem(base))
    assert collect_shm(view)["bytes"] == 64 * 2**20
    assert "ib0" in {n["name"] for n in collect_nics(view)}
    assert "ens1f0np0" in {n["name"] for n in collect_nics(view)}


def test_collect_record_on_a_fixture_node(tmp_path: Path) -> None:
    env = {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.2",
        "MASTER_PORT": "1",
        "GROUP_RANK": "1",
        "NCCL_SOCKET_IFNAME": "ens",
        "CUDA_VISIBLE_DEVICES": "1",
        "HOME": "/root",
    }
    record = collect_record(env, SnapshotSystem(make_node(tmp_path)))
    assert (record["rank"], record["node_rank"]) == (1, 1)
    assert record["env"] == {"NCCL_SOCKET_IFNAME": "ens"}  # steering variables only
    assert record["visible_devices"] == {"CUDA_VISIBLE_DEVICES": "1"}
    assert record["cmdline"] == "BOOT_IMAGE=/vmlinuz root=UUID=REDACTED ro iommu=pt"
    assert record["shm"]["bytes"] == 16 * GiB
    assert "packaging" not in record["packages"]  # only the stack's packages


# --- findings on planted faults ---------------------------------------------------------------


def _record(tmp_path: Path, rank: int, node: int, **tree: Any) -> dict[str, Any]:
    env = {
        "RANK": str(rank),
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "h",
        "MASTER_PORT": "1",
        "GROUP_RANK": str(node),
    }
    rec = collect_record(env, SnapshotSystem(make_node(tmp_path / f"n{node}", **tree)))
    rec["host"] = f"host{node}"
    rec["packages"] = {"torch": {"version": "2.11.0", "record_sha256": "aa"}}
    rec["torch"] = {
        "version": "2.11.0",
        "cuda": "13.0",
        "hip": None,
        "nccl": "2.27.7",
        "gpus": [{"name": "NVIDIA H100", "arch": "sm_90"}],
    }
    rec["lock"] = {"target": "nvidia", "row": "current", "sha256": "ff"}
    return rec


@pytest.fixture
def pair(tmp_path: Path) -> list[dict[str, Any]]:
    return [_record(tmp_path, 0, 0), _record(tmp_path, 1, 1)]


def _by_id(records: list[dict[str, Any]]) -> dict[str, Any]:
    return {r.id: r for r in cluster_findings(records)}


def test_a_clean_pair_has_no_failure(pair: list[dict[str, Any]]) -> None:
    found = _by_id(pair)
    assert {i: r.status for i, r in found.items() if r.status in ("warn", "fail")} == {}
    assert found["cluster.versions"].status == "ok"
    assert found["cluster.gid_index"].finding.endswith("index 3 on every port)")


def test_version_difference_names_both_nodes(pair: list[dict[str, Any]]) -> None:
    pair[1]["torch"]["nccl"] = "2.21.5"
    pair[1]["packages"]["triton"] = {"version": "3.5.0", "record_sha256": "bb"}
    r = _by_id(pair)["cluster.versions"]
    assert r.status == "fail"
    assert "NCCL/RCCL: node 0 (host0) 2.27.7, node 1 (host1) 2.21.5" in r.finding
    assert "triton: node 0 (host0) absent, node 1 (host1) 3.5.0" in r.finding
    assert "greta install --from-record DIR" in r.fix


def test_same_version_other_build_is_a_warning(pair: list[dict[str, Any]]) -> None:
    pair[1]["packages"]["torch"]["record_sha256"] = "cc"
    r = _by_id(pair)["cluster.versions"]
    assert r.status == "warn" and "different builds of torch" in r.finding


def test_small_shm_fails_with_the_container_fix(tmp_path: Path) -> None:
    records = [_record(tmp_path, 0, 0), _record(tmp_path, 1, 1, shm="65536k")]
    r = _by_id(records)["cluster.shm"]
    assert r.status == "fail" and "node 1 (host1) 64 MiB" in r.finding
    assert "--shm-size" in r.fix and "emptyDir" in r.fix


@pytest.mark.parametrize(
    ("value", "status", "text"),
    [
        ("eth9", "fail", "names no interface on node 1 (host1)"),
        ("docker", "fail", "only interfaces that are down"),
        ("lo", "fail", "loopback interface on node 1 (host1), but the ranks span hosts"),
        ("eno1", "warn", "a management port"),
        ("ens", None, None),
        ("^docker,lo,eno", None, None),
    ],
)
def test_socket_ifname(
    pair: list[dict[str, Any]], value: str, status: str | None, text: str | None
) -> None:
    for rec in pair:
        rec["env"]["NCCL_SOCKET_IFNAME"] = value if rec["rank"] == 1 else "ens"
    r = _by_id(pair)["cluster.socket_ifname"]
    if status is None:
        assert r.status == "ok"
        return
    assert r.status == status and text in r.finding
    assert r.fix == "export NCCL_SOCKET_IFNAME=ens1f0np0   # on node 1 (host1)"


def test_ib_hca_naming_a_missing_device(pair: list[dict[str, Any]]) -> None:
    for rec in pair:
        rec["env"]["NCCL_IB_HCA"] = "mlx5_0:1" if rec["rank"] == 0 else "=mlx5_4"
    r = _by_id(pair)["cluster.ib_hca"]
    assert r.status == "fail" and "NCCL_IB_HCA==mlx5_4 names no RDMA port on node 1" in r.finding
    assert r.fix == "export NCCL_IB_HCA=mlx5_0:1   # node 1 (host1)"


def test_ib_hca_on_a_port_that_is_down(tmp_path: Path) -> None:
    records = [_record(tmp_path, 0, 0), _record(tmp_path, 1, 1, ib_state="1: DOWN")]
    for rec in records:
        rec["env"]["NCCL_IB_HCA"] = "mlx5_0"
    found = _by_id(records)
    assert found["cluster.ib_hca"].status == "fail"
    assert "not ACTIVE on node 1" in found["cluster.ib_hca"].finding
    assert found["cluster.rdma"].status == "fail"
    assert "no ACTIVE RDMA port on node 1" in found["cluster.rdma"].finding


def test_gid_index_against_the_roce_table(pair: list[dict[str, Any]]) -> None:
    for rec in pair:
        rec["env"]["NCCL_IB_GID_INDEX"] = "3"
    assert _by_id(pair)["cluster.gid_index"].status == "ok"
    pair[1]["env"]["NCCL_IB_GID_INDEX"] = "2"  # the v1 entry
    r = _by_id(pair)["cluster.gid_index"]
    assert r.status == "fail" and "is a IB/RoCE v1 GID of mlx5_0:1 on node 1" in r.finding
    assert r.fix == "export NCCL_IB_GID_INDEX=3   # node 1 (host1)"
    pair[1]["env"]["NCCL_IB_GID_INDEX"] = "6"  # an empty slot
    assert "empty GID slot" in _by_id(pair)["cluster.gid_index"].finding


def test_gid_tables_that_disagree_between_nodes(tmp_path: Path) -> None:
    shifted = {0: ROCE_GIDS[0], 1: ROCE_GIDS[1], 4: ROCE_GIDS[2], 5: ROCE_GIDS[3]}
    records = [_record(tmp_path, 0, 0), _record(tmp_path, 1, 1, gids=shifted)]
    r = _by_id(records)["cluster.gid_index"]
    assert r.status == "warn" and "mlx5_0:1 on node 1 (host1): 5" in r.finding


def test_amd_nodes_iommu_scratch_reclaim_and_msccl(pair: list[dict[str, Any]]) -> None:
    for rec in pair:
        rec["torch"] = {
            "version": "2.11.0",
            "hip": "7.13.1",
            "cuda": None,
            "nccl": "2.27.7",
            "gpus": [{"name": "AMD Instinct MI250X", "arch": "gfx90a"}],
        }
        rec["rocm"] = "7.13.1"
    pair[1]["cmdline"] = "BOOT_IMAGE=/vmlinuz ro quiet"
    found = _by_id(pair)
    assert found["cluster.iommu"].status == "warn"
    assert "node 1 (host1)" in found["cluster.iommu"].finding
    assert "iommu=pt" in found["cluster.iommu"].fix
    assert found["cluster.scratch_reclaim"].status == "warn"
    assert found["cluster.scratch_reclaim"].fix.startswith("export HSA_NO_SCRATCH_RECLAIM=1")
    assert found["cluster.msccl"].status == "warn"
    for rec in pair:
        rec["env"].update(HSA_NO_SCRATCH_RECLAIM="1", RCCL_MSCCL_ENABLE="0")
        rec["rocm"] = rec["torch"]["hip"] = "7.2.0"
    found = _by_id(pair)
    assert found["cluster.scratch_reclaim"].status == "ok"
    assert found["cluster.msccl"].status == "ok"


def test_numa_balancing_on_a_gpu_node(pair: list[dict[str, Any]]) -> None:
    pair[0]["numa_balancing"], pair[1]["numa_balancing"] = "0", "1"
    r = _by_id(pair)["cluster.numa_balancing"]
    assert r.status == "warn" and "is on on node 1 (host1):" in r.finding
    assert r.fix.startswith("sudo sysctl -w kernel.numa_balancing=0")
    pair[1]["torch"]["gpus"] = []  # a CPU-only node: nothing to tune
    assert _by_id(pair)["cluster.numa_balancing"].status == "ok"


def test_env_and_arch_differences(pair: list[dict[str, Any]]) -> None:
    pair[1]["env"]["NCCL_PROTO"] = "Simple"
    pair[1]["torch"]["gpus"] = [{"name": "NVIDIA A100", "arch": "sm_80"}]
    found = _by_id(pair)
    assert found["cluster.env"].status == "warn"
    assert "NCCL_PROTO (rank 0: unset, rank 1: Simple)" in found["cluster.env"].finding
    assert found["cluster.gpu_archs"].status == "warn"
    assert "sm_80: ranks [1]; sm_90: ranks [0]" in found["cluster.gpu_archs"].finding


def test_a_malformed_record_is_an_internal_finding_not_a_crash(pair: list[dict[str, Any]]) -> None:
    bad = copy.deepcopy(pair)
    bad[1]["nics"] = None
    bad[1]["env"]["NCCL_SOCKET_IFNAME"] = "x"
    found = _by_id(bad)
    assert found["cluster.socket_ifname"].status == "fail"
    assert len(found) == 14


# --- the collective's bandwidth gate ----------------------------------------------------------


def test_default_gate_follows_the_link() -> None:
    one_host = [
        {"host": "a", "link": {"local": "nvlink"}},
        {"host": "a", "link": {"local": "nvlink"}},
    ]
    assert default_gate("nccl", one_host) == ("nvlink", 100.0)
    rdma = [{"host": h, "link": {"rdma_gbits": 8 * 400.0}} for h in "ab"]
    assert default_gate("nccl", rdma) == ("rdma", 100.0)
    mixed = [{"host": "a", "link": {"rdma_gbits": 400.0}}, {"host": "b", "link": {"rdma_gbits": 0}}]
    assert default_gate("nccl", mixed) == ("socket", 1.0)
    assert default_gate("gloo", rdma) == ("gloo", None)


def test_gate_rows_judge_only_bandwidth_bound_sizes() -> None:
    rows = [
        {"bytes": 2**20, "all_reduce_busbw": 0.5},
        {"bytes": 256 * 2**20, "all_reduce_busbw": 90.0},
    ]
    assert [r["gate"] for r in gate_rows(rows, 100.0)] == ["n/a", "below"]
    assert [r["gate"] for r in gate_rows(rows, 50.0)] == ["n/a", "pass"]
    assert [r["gate"] for r in gate_rows(rows[:1], 0.25)] == ["pass"]  # the largest is gated
    assert [r["gate"] for r in gate_rows(rows, None)] == ["n/a", "n/a"]


def test_local_link_from_nvidia_topology() -> None:
    topo = (
        "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\n"
        "GPU0\t X \tNV18\t0-31\t0\n"
        "GPU1\tNV18\t X \t0-31\t0\n"
    )
    assert local_link({"nvidia": topo}) == "nvlink"
    assert local_link({"nvidia": topo.replace("NV18", "PIX")}) == "pcie"
    assert local_link({}) is None


# --- the collective's verdicts (pure) -----------------------------------------------------------


def _hb(beat: int, seq: int, phase: str, node: int) -> dict[str, Any]:
    return {
        "beat": beat,
        "seq": seq,
        "phase": phase,
        "host": f"host{node}",
        "node": str(node),
        "transport": {},
    }


def test_stall_blames_the_rank_that_never_entered() -> None:
    first = {0: _hb(10, 7, "all_reduce of 64 MiB (check)", 0), 1: _hb(9, 5, "between", 1)}
    second = {0: _hb(14, 7, "all_reduce of 64 MiB (check)", 0), 1: _hb(13, 5, "between", 1)}
    v = judge_stall(2, first, second, "all_reduce of 64 MiB (check)", 30.0)
    assert [s["rank"] for s in v["suspects"]] == [1]
    assert "Suspect rank 1 (node 1, host host1): alive but never entered" in v["error"]


def test_stall_blames_a_frozen_rank_and_a_silent_one() -> None:
    first = {0: _hb(10, 7, "p", 0), 1: _hb(9, 7, "p", 1)}
    second = {0: _hb(14, 7, "p", 0), 1: _hb(9, 7, "p", 1)}  # rank 1's beat stopped
    v = judge_stall(3, first, second, "p", 30.0)
    assert [(s["rank"], s["why"].split(" (")[0]) for s in v["suspects"]] == [
        (2, "never published a heartbeat"),
        (1, "heartbeat stopped"),
    ]


def test_stall_with_every_rank_inside_names_the_link() -> None:
    both = {0: _hb(10, 7, "p", 0), 1: _hb(10, 7, "p", 1)}
    later = {r: {**e, "beat": e["beat"] + 4} for r, e in both.items()}
    later[1]["transport"] = {"NCCL_SOCKET_IFNAME": "ens1"}
    v = judge_stall(2, both, later, "all_reduce of 256 MiB (timed)", 30.0)
    assert v["suspects"] == []
    assert "every rank inside it" in v["error"]
    assert 'node 1 (host1, {"NCCL_SOCKET_IFNAME": "ens1"})' in v["error"]


def _job(result: dict[str, Any], code: int | None = 0, threshold: float | None = None) -> JobRun:
    return judge_job(JobRun(0, 2, "nccl", result=result), code, 60.0, threshold)


def _row(nbytes: int, busbw: float, ok: bool = True) -> dict[str, Any]:
    return {
        "bytes": nbytes,
        "all_reduce_ok": ok,
        "all_gather_ok": True,
        "all_reduce_s": 1e-3,
        "all_gather_s": 1e-3,
        "all_reduce_busbw": busbw,
        "all_gather_busbw": busbw / 2,
    }


def test_job_verdicts() -> None:
    peers = [{"host": "a", "link": {"local": "nvlink"}}, {"host": "a", "link": {"local": "nvlink"}}]
    good = {
        "peers": peers,
        "sizes": [_row(2**20, 10.0), _row(256 * 2**20, 280.0)],
        "all_reduce_ok": True,
        "all_gather_ok": True,
        "graph_capture": "ok",
    }
    run = _job(good)
    assert (run.status, run.link, run.threshold_gbps) == ("ok", "nvlink", 100.0)
    assert [r["gate"] for r in run.rows] == ["n/a", "pass"]
    assert run.message.endswith("graph capture: ok")
    slow = _job(good, threshold=300.0)
    assert slow.status == "slow" and "280.00 GB/s at 256 MiB is below the 300 GB/s" in slow.message
    wrong = _job({**good, "sizes": [_row(2**20, 1.0, ok=False)], "all_reduce_ok": False})
    assert wrong.status == "wrong" and "all-reduce of 1 MiB" in wrong.message
    killed = _job({"peers": peers}, code=None)
    assert killed.status == "hang" and "joining the process group" in killed.message
    crashed = _job({"error": "DistBackendError: NCCL error"}, code=1)
    assert crashed.status == "crashed" and "NCCL error" in crashed.message


def test_job_detection_and_sizes() -> None:
    assert in_job({"RANK": "0", "WORLD_SIZE": "2"})
    assert in_job({"SLURM_PROCID": "0", "SLURM_NTASKS": "4"})
    assert not in_job({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"})  # an salloc shell
    assert not in_job({})
    assert parse_sizes("64,1,16") == [1.0, 16.0, 64.0]
    assert "comma-separated" in str(parse_sizes("1,x"))
    assert "positive" in str(parse_sizes("0"))


def test_preflight_inside_an_existing_process_group() -> None:
    torch = pytest.importorskip("torch")
    dist = torch.distributed
    from greta_core.distributed import cluster_preflight

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        found = {r.id: r for r in cluster_preflight()}
    finally:
        dist.destroy_process_group()
    assert found["cluster.gather"].status == "ok"
    assert found["cluster.gather"].finding.startswith("1 rank(s) on 1 node(s)")
    assert found["cluster.versions"].status == "skip"  # one node: nothing to compare


def _greta_doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "MASTER_", "LOCAL_RANK"))
    }
    return subprocess.run(
        [sys.executable, "-m", "greta", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**base, "PYTHONPATH": str(ROOT), **(env or {})},
    )


def test_cluster_outside_a_job_says_how_to_start_it() -> None:
    done = _greta_doctor("--cluster")
    assert done.returncode == 2 and "torchrun --nnodes N" in done.stderr
    slurm = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "gpu[1-2]"}
    done = _greta_doctor("--cluster", env=slurm)
    assert done.returncode == 2 and "export MASTER_PORT" in done.stderr


def test_collective_in_a_job_rejects_bad_options_before_starting() -> None:
    job = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    done = _greta_doctor("--collective", "--sizes-mb", "1,big", env=job)
    assert done.returncode == 2 and "comma-separated list of MiB" in done.stderr
    done = _greta_doctor("--collective", "--stall-timeout", "0", env=job)
    assert done.returncode == 2 and "--stall-timeout must be positive" in done.stderr


def test_collective_check_inside_an_existing_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    dist = torch.distributed
    from greta_core.distributed import collective_check

    monkeypatch.delenv("MASTER_ADDR", raising=False)  # no store to watch: no watchdog
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        run = collective_check(sizes_mib=(0.0625, 0.25), iters=2)
    finally:
        dist.destroy_process_group()
    assert (run.status, run.backend, run.link, run.threshold_gbps) == ("ok", "gloo", "gloo", None)
    assert [r["bytes"] for r in run.rows] == [2**16, 2**18]
    assert all(r["all_reduce_ok"] and r["all_gather_ok"] and r["gate"] == "n/a" for r in run.rows)
    # One rank: busbw = algbw x 2(n-1)/n = 0, the formula nccl-tests uses.
    assert all(r["all_reduce_busbw"] == 0 for r in run.rows)


def test_workers_are_told_where_this_interpreter_finds_torch() -> None:
    pytest.importorskip("torch")
    from greta_install.doctor.collective import TORCH_PATH_ENV, worker_env

    env = worker_env()
    assert (Path(env[TORCH_PATH_ENV]) / "torch" / "__init__.py").is_file()
    assert env["NCCL_NVLS_ENABLE"] == "0"  # multicast stays off in every worker
