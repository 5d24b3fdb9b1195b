"""`greta doctor --cluster`: compare the nodes' records, and judge the known-bad settings.

Pure functions over the list of records every rank gathered (cluster_facts.py collects one,
cluster_worker.py gathers them through torch.distributed). Node-level facts (packages,
drivers, interfaces, /dev/shm) are read from each node's first rank; the environment and
the torch half from every rank. Each finding says which node and what to type there.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from greta_install.doctor.cluster_facts import parse_selector, select
from greta_install.doctor.model import CheckResult, Finding, fail, ok, skip, warn

Record = dict[str, Any]
SHM_MIN_BYTES = 1 << 30  # NCCL's and RCCL's container guides ask for --shm-size of 1 GiB or more
MANAGEMENT_RATIO = 10  # an interface 10x slower than the fastest one up is a management port
_VIRTUAL = re.compile(r"^(docker|virbr|veth|br-|cni|flannel|cali|vxlan|tun|tap|ifb|dummy)")
INSTALL_FIX = (
    "greta install --save-wheelhouse DIR   # on the node with the wanted versions\n"
    "greta install --from-record DIR        # on every other node: the same bytes"
)


def _label(rec: Record) -> str:
    return f"node {rec.get('node_rank', '?')} ({rec.get('host', '?')})"


def nodes(records: Sequence[Record]) -> list[Record]:
    """One record per node: its lowest rank's (node facts are the same on all its ranks)."""
    first: dict[Any, Record] = {}
    for rec in sorted(records, key=lambda r: r.get("rank", 0)):
        first.setdefault((rec.get("host"), rec.get("node_rank")), rec)
    return list(first.values())


def _spans_hosts(records: Sequence[Record]) -> bool:
    return len({r.get("host") for r in records}) > 1


def _is_amd(rec: Record) -> bool:
    torch = rec.get("torch") or {}
    return bool(torch.get("hip") or rec.get("driver", {}).get("amdgpu") or rec.get("rocm"))


def _archs(rec: Record) -> list[str]:
    return [g.get("arch") or "?" for g in (rec.get("torch") or {}).get("gpus", [])]


# --- versions -----------------------------------------------------------------------------


def _version_fields(rec: Record) -> dict[str, Any]:
    torch = rec.get("torch") or {}
    lock = rec.get("lock") or {}
    fields: dict[str, Any] = {
        "python": rec.get("python"),
        "greta": rec.get("greta"),
        "lock row": f"{lock.get('target')}/{lock.get('row')} {lock.get('sha256')}"
        if lock.get("target")
        else None,
        "torch (runtime)": torch.get("version"),
        "CUDA": torch.get("cuda"),
        "HIP": torch.get("hip"),
        "NCCL/RCCL": torch.get("nccl"),
        "ROCm": rec.get("rocm"),
        "amdgpu driver": (rec.get("driver") or {}).get("amdgpu"),
        "NVIDIA driver": (rec.get("driver") or {}).get("nvidia"),
    }
    for name, pkg in (rec.get("packages") or {}).items():
        fields[name] = pkg.get("version")
    return fields


def check_versions(records: Sequence[Record]) -> Finding:
    per_node = nodes(records)
    if len(per_node) < 2:
        return skip("one node: nothing to compare")
    fields = [_version_fields(r) for r in per_node]
    names = sorted({k for f in fields for k in f})
    differ = {}
    for name in names:
        values = [f.get(name) for f in fields]
        if len(set(map(str, values))) > 1:
            differ[name] = {_label(r): v for r, v in zip(per_node, values, strict=True)}
    # Same version, another build: the RECORD of the wheel differs.
    builds = {}
    for name in sorted({k for r in per_node for k in (r.get("packages") or {})}):
        pkgs = [(r.get("packages") or {}).get(name) or {} for r in per_node]
        if name in differ or any(not p.get("record_sha256") for p in pkgs):
            continue
        if len({p["record_sha256"] for p in pkgs}) > 1:
            builds[name] = {
                _label(r): p["record_sha256"] for r, p in zip(per_node, pkgs, strict=True)
            }
    if differ:
        shown = "; ".join(
            f"{name}: " + ", ".join(f"{n} {v or 'absent'}" for n, v in by.items())
            for name, by in list(differ.items())[:4]
        )
        more = f" and {len(differ) - 4} more" if len(differ) > 4 else ""
        return fail(
            f"the nodes run different software: {shown}{more}. Ranks built from different "
            "torch/NCCL/ROCm versions crash or hang in their first collective",
            INSTALL_FIX,
            differ=differ,
            builds=builds,
        )
    if builds:
        return warn(
            f"same versions, different builds of {', '.join(builds)} (the wheels' RECORD "
            "differ): one node installed from another index or a local build",
            INSTALL_FIX,
            builds=builds,
        )
    return ok(f"{len(per_node)} nodes run the same versions ({len(names)} compared)")


def check_gpu_archs(records: Sequence[Record]) -> Finding:
    with_gpu = [r for r in records if _archs(r)]
    if not with_gpu:
        return skip("no rank sees a GPU (torch)")
    by_arch: dict[str, list[int]] = {}
    for rec in records:
        for arch in _archs(rec) or ["none"]:
            by_arch.setdefault(arch, []).append(rec.get("rank", -1))
    if len(by_arch) > 1:
        shown = "; ".join(f"{a}: ranks {sorted(set(r))}" for a, r in sorted(by_arch.items()))
        return warn(
            f"the ranks drive different GPUs ({shown}): a job runs at its slowest GPU's pace, "
            "and kernels tuned or built for one arch may be missing on the other",
            "run one job per GPU type (Slurm: --constraint=<gpu type>; Kubernetes: a "
            "nodeSelector on the GPU product label)",
            archs=by_arch,
        )
    return ok(f"every rank drives {next(iter(by_arch))}")


# --- environment --------------------------------------------------------------------------


def check_env(records: Sequence[Record]) -> Finding:
    if len(records) < 2:
        return skip("one rank: nothing to compare")
    keys = sorted({k for r in records for k in r.get("env", {})})
    differ = {}
    for key in keys:
        values = {r.get("rank"): r.get("env", {}).get(key) for r in records}
        if len(set(values.values())) > 1:
            differ[key] = values
    if differ:
        key, values = next(iter(differ.items()))
        shown = ", ".join(f"rank {k}: {v if v is not None else 'unset'}" for k, v in values.items())
        return warn(
            f"the NCCL/RCCL/HSA environment differs between ranks: {key} ({shown})"
            + (f" and {len(differ) - 1} more variable(s)" if len(differ) > 1 else "")
            + ". Ranks that disagree on protocols or transports hang in their first collective",
            "export the same variables on every node (in the job script, before torchrun/srun)",
            differ={k: {str(r): v for r, v in vs.items()} for k, vs in differ.items()},
        )
    return ok(f"the same {len(keys)} NCCL/RCCL/HSA/gloo variable(s) on every rank")


def _up(nic: dict[str, Any]) -> bool:
    return nic.get("admin_up") is not False and nic.get("operstate") in ("up", "unknown")


def _best_interface(nics: list[dict[str, Any]]) -> str | None:
    usable = [n for n in nics if _up(n) and n.get("type") != 772 and not _VIRTUAL.match(n["name"])]
    usable.sort(key=lambda n: (-(n.get("speed_mbps") or 0), not n.get("physical"), n["name"]))
    return usable[0]["name"] if usable else None


def _ifname_problem(
    rec: Record, var: str, value: str, multi_host: bool
) -> tuple[str, str, str] | None:
    """(status, finding, fix) for one socket-interface variable on one node, or None."""
    nics = rec.get("nics") or []
    names = [n["name"] for n in nics]
    chosen = select(names, value)
    best = _best_interface(nics)
    fix = f"export {var}={best}" if best else f"unset {var}"
    fix += f"   # on {_label(rec)}"
    if not chosen:
        return (
            "fail",
            f"{var}={value} names no interface on {_label(rec)} (it has {', '.join(names) or 'none'})",
            fix,
        )
    by_name = {n["name"]: n for n in nics}
    up = [c for c in chosen if _up(by_name[c])]
    if not up:
        return (
            "fail",
            f"{var}={value} matches only interfaces that are down on {_label(rec)} ({', '.join(chosen)})",
            fix,
        )
    if multi_host and all(by_name[c].get("type") == 772 for c in up):
        return (
            "fail",
            f"{var}={value} is the loopback interface on {_label(rec)}, but the ranks span hosts",
            fix,
        )
    if all(_VIRTUAL.match(c) for c in up):
        return (
            "warn",
            f"{var}={value} selects virtual interface(s) {', '.join(up)} on {_label(rec)}",
            fix,
        )
    fastest = max((n.get("speed_mbps") or 0 for n in nics if _up(n)), default=0)
    speeds = [by_name[c].get("speed_mbps") for c in up]
    if fastest and all(s and s * MANAGEMENT_RATIO <= fastest for s in speeds):
        finding = (
            f"{var}={value} selects {', '.join(up)} at {max(s or 0 for s in speeds)} Mb/s on "
            f"{_label(rec)} while {best} runs at {fastest} Mb/s: a management port carries the "
            "bootstrap and socket traffic"
        )
        return "warn", finding, fix
    return None


def check_socket_ifname(records: Sequence[Record]) -> Finding:
    multi = _spans_hosts(records)
    problems: list[tuple[str, str, str]] = []
    seen = False
    for rec in records:
        for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
            value = (rec.get("env") or {}).get(var)
            if value is None:
                continue
            seen = True
            found = _ifname_problem(rec, var, value, multi)
            if found and found not in problems:
                problems.append(found)
    if not seen:
        return ok(
            "NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME unset: NCCL and gloo pick the interface"
        )
    if not problems:
        return ok(
            "NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME select an interface that is up on every node"
        )
    make = fail if any(s == "fail" for s, _, _ in problems) else warn
    return make(
        "; ".join(f for _, f, _ in problems),
        "\n".join(dict.fromkeys(fx for _, _, fx in problems)),
        problems=[f for _, f, _ in problems],
    )


# --- /dev/shm, IOMMU, ROCr ----------------------------------------------------------------


def check_shm(records: Sequence[Record]) -> Finding:
    small, unknown = [], []
    for rec in nodes(records):
        size = (rec.get("shm") or {}).get("bytes")
        if size is None:
            unknown.append(_label(rec))
        elif size < SHM_MIN_BYTES:
            small.append((rec, size))
    if small:
        shown = ", ".join(f"{_label(r)} {s / 2**20:.0f} MiB" for r, s in small)
        return fail(
            f"/dev/shm is small on {shown}: NCCL's and RCCL's shared-memory transport between "
            "the ranks of a node fails ('unhandled system error', bus errors) or falls back",
            "docker run --shm-size=16g ...   # Docker\n"
            "Kubernetes: mount an emptyDir {medium: Memory, sizeLimit: 16Gi} at /dev/shm\n"
            "sudo mount -o remount,size=16G /dev/shm   # a host",
            small={_label(r): s for r, s in small},
        )
    if unknown and len(unknown) == len(nodes(records)):
        return skip("the size of /dev/shm is unknown on every node")
    return ok("/dev/shm is at least 1 GiB on every node")


def _cmdline_params(cmdline: str) -> dict[str, str]:
    return dict(p.split("=", 1) if "=" in p else (p, "") for p in cmdline.split())


def check_iommu(records: Sequence[Record]) -> Finding:
    amd = [r for r in nodes(records) if _is_amd(r)]
    if not amd:
        return skip("no AMD GPU node (iommu=pt is RCCL's requirement)")
    missing = []
    for rec in amd:
        if rec.get("cmdline") is None:
            continue
        params = _cmdline_params(rec["cmdline"])
        off = params.get("iommu") == "off" or "off" in (
            params.get("amd_iommu"),
            params.get("intel_iommu"),
        )
        if params.get("iommu") != "pt" and not off:
            missing.append(_label(rec))
    if missing:
        return warn(
            f"iommu=pt is missing from the kernel command line on {', '.join(missing)}: RCCL "
            "warns 'Missing \"iommu=pt\"' and multi-GPU all-reduces are reported to hang",
            "sudoedit /etc/default/grub   # add iommu=pt to GRUB_CMDLINE_LINUX_DEFAULT\n"
            "sudo update-grub && sudo reboot",
            nodes=missing,
        )
    return ok("iommu=pt on every AMD node")


def _version_tuple(text: str | None) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text or "")[:2])


def check_scratch_reclaim(records: Sequence[Record]) -> Finding:
    hit = []
    for rec in records:
        rocm = rec.get("rocm") or (rec.get("torch") or {}).get("hip")
        unset = (rec.get("env") or {}).get("HSA_NO_SCRATCH_RECLAIM") != "1"
        if "gfx90a" in _archs(rec) and _version_tuple(rocm) >= (7, 13) and unset:
            hit.append(rec.get("rank"))
    if not any("gfx90a" in _archs(r) for r in records):
        return skip("no gfx90a (MI200-series) GPU")
    if hit:
        return warn(
            f"ranks {hit}: gfx90a on ROCm >= 7.13 without HSA_NO_SCRATCH_RECLAIM=1: the "
            "runtime's per-launch scratch reclaim adds a fixed cost to every collective, "
            "5-10x on messages under 16 MB (ROCm/rocm-systems#11472, RCCL usage tips)",
            "export HSA_NO_SCRATCH_RECLAIM=1   # on every gfx90a node",
            ranks=hit,
        )
    return ok("gfx90a ranks set HSA_NO_SCRATCH_RECLAIM=1 (or run ROCm before 7.13)")


def check_msccl(records: Sequence[Record]) -> Finding:
    if not (_spans_hosts(records) and any(_is_amd(r) for r in records)):
        return skip("not an AMD job across hosts")
    unset = [
        r.get("rank") for r in records if (r.get("env") or {}).get("RCCL_MSCCL_ENABLE") is None
    ]
    if unset:
        return warn(
            f"ranks {unset} leave RCCL_MSCCL_ENABLE unset: AMD's multi-node training recipes "
            "set it to 0 (MSCCL's algorithms are tuned for one node)",
            "export RCCL_MSCCL_ENABLE=0",
            ranks=unset,
        )
    return ok("RCCL_MSCCL_ENABLE set on every rank")


def check_acs(records: Sequence[Record]) -> Finding:
    known = [r for r in nodes(records) if r.get("acs_redirecting") is not None]
    if not known:
        return skip("the ACS registers were not readable (lspci -vvv as root)")
    bad = {_label(r): r["acs_redirecting"] for r in known if r["acs_redirecting"]}
    if bad:
        shown = "; ".join(f"{n}: {', '.join(b[:3])}" for n, b in bad.items())
        return fail(
            f"PCIe ACS redirects peer traffic on {shown}: GPU-to-NIC (GPUDirect RDMA) and "
            "GPU-to-GPU traffic goes up to the root complex, where collectives crawl or hang",
            "disable ACS in the BIOS, or: for b in <bridges>; do sudo setpci -s $b ECAP_ACS+6.w=0000; done",
            bridges=bad,
        )
    return ok(f"ACS off on the bridges of {len(known)} node(s)")


def check_numa_balancing(records: Sequence[Record]) -> Finding:
    known = [r for r in nodes(records) if r.get("numa_balancing") is not None]
    if not known:
        return skip("kernel.numa_balancing not readable on any node")
    on = [r for r in known if r["numa_balancing"] != "0" and _archs(r)]
    if on:
        return warn(
            f"NUMA auto-balancing is on on {', '.join(_label(r) for r in on)}: the kernel keeps "
            "unmapping pages to migrate them, which AMD's MI300X tuning guide and RCCL name as "
            "a cause of slow collectives (and it differs from node to node when only some "
            "were tuned)",
            "sudo sysctl -w kernel.numa_balancing=0   # on those nodes\n"
            "echo kernel.numa_balancing=0 | sudo tee /etc/sysctl.d/90-greta-numa.conf",
            nodes=[_label(r) for r in on],
        )
    return ok(f"NUMA auto-balancing off (or no GPU) on the {len(known)} node(s) that report it")


# --- RDMA -----------------------------------------------------------------------------------


def _ports(rec: Record) -> list[dict[str, Any]]:
    return list(rec.get("rdma") or [])


def _hca_matches(value: str, port: dict[str, Any]) -> bool:
    exclude, exact, items = parse_selector(value)
    hit = any(
        (port["device"] == n if exact else str(port["device"]).startswith(n))
        and (p is None or p == port["port"])
        for n, p in items
    )
    return hit != exclude


def check_ib_hca(records: Sequence[Record]) -> Finding:
    problems, fixes = [], []
    seen = False
    for rec in nodes(records):
        value = (rec.get("env") or {}).get("NCCL_IB_HCA")
        if not value:
            continue
        seen = True
        ports = _ports(rec)
        chosen = [p for p in ports if _hca_matches(value, p)]
        active = [p for p in ports if p.get("state") == "ACTIVE"]
        names = sorted({f"{p['device']}:{p['port']}" for p in active})
        fix = f"export NCCL_IB_HCA={','.join(names)}" if names else "unset NCCL_IB_HCA"
        if not chosen:
            have = ", ".join(sorted({str(p["device"]) for p in ports})) or "no RDMA device"
            problems.append(f"NCCL_IB_HCA={value} names no RDMA port on {_label(rec)} ({have})")
            fixes.append(f"{fix}   # {_label(rec)}")
        elif not any(p.get("state") == "ACTIVE" for p in chosen):
            shown = ", ".join(f"{p['device']}:{p['port']} {p.get('state')}" for p in chosen)
            problems.append(
                f"NCCL_IB_HCA={value} selects only ports that are not ACTIVE on {_label(rec)} ({shown})"
            )
            fixes.append(f"{fix}   # {_label(rec)}")
    if not seen:
        return ok("NCCL_IB_HCA unset: NCCL uses every RDMA port it finds")
    if problems:
        return fail(
            "; ".join(problems) + ": NCCL falls back to sockets or fails to connect (a wrong "
            "HCA cost 29% of all-reduce bandwidth in NVIDIA-NeMo/RL#3670)",
            "\n".join(dict.fromkeys(fixes)),
        )
    return ok("NCCL_IB_HCA selects an ACTIVE port on every node")


def _roce_v2_ipv4(port: dict[str, Any]) -> int | None:
    for g in port.get("gids", []):
        if "v2" in str(g.get("type") or "").lower() and str(g.get("gid", "")).startswith(
            "0000:0000:0000:0000:0000:ffff:"
        ):
            return g["index"]
    return None


def check_gid_index(records: Sequence[Record]) -> Finding:
    roce = [
        (rec, p)
        for rec in nodes(records)
        for p in _ports(rec)
        if p.get("link_layer") == "Ethernet"
        and p.get("state") == "ACTIVE"
        and (
            not (rec.get("env") or {}).get("NCCL_IB_HCA")
            or _hca_matches(rec["env"]["NCCL_IB_HCA"], p)
        )
    ]
    if not roce:
        return skip("no ACTIVE RoCE port (NCCL_IB_GID_INDEX applies to RoCE)")
    problems, fixes = [], []
    v2_indexes = {}
    for rec, port in roce:
        where = f"{port['device']}:{port['port']} on {_label(rec)}"
        best = _roce_v2_ipv4(port)
        v2_indexes[where] = best
        value = (rec.get("env") or {}).get("NCCL_IB_GID_INDEX")
        if value is None:
            continue
        gid = next((g for g in port.get("gids", []) if str(g["index"]) == value.strip()), None)
        fix = f"export NCCL_IB_GID_INDEX={best}" if best is not None else "unset NCCL_IB_GID_INDEX"
        if gid is None:
            problems.append(f"NCCL_IB_GID_INDEX={value} is an empty GID slot of {where}")
            fixes.append(f"{fix}   # {_label(rec)}")
        elif "v2" not in str(gid.get("type") or "").lower():
            problems.append(
                f"NCCL_IB_GID_INDEX={value} is a {gid.get('type')} GID of {where} (RoCE v2 routes across subnets; v1 does not)"
            )
            fixes.append(f"{fix}   # {_label(rec)}")
    if problems:
        return fail(
            "; ".join(problems)
            + ": the queue pairs do not connect, NCCL times out in its first collective",
            "\n".join(dict.fromkeys(fixes)),
            roce_v2_ipv4=v2_indexes,
        )
    distinct = {v for v in v2_indexes.values()}
    if len(distinct) > 1:
        shown = ", ".join(f"{w}: {i}" for w, i in v2_indexes.items())
        return warn(
            f"the RoCE v2 IPv4 GID sits at different indexes on the nodes ({shown}): one "
            "NCCL_IB_GID_INDEX for the whole job is wrong somewhere",
            "give every node the same interface/GID layout, or leave NCCL_IB_GID_INDEX unset "
            "(NCCL >= 2.21 picks the RoCE v2 GID itself)",
            roce_v2_ipv4=v2_indexes,
        )
    return ok(f"RoCE GID tables agree (RoCE v2 IPv4 at index {distinct.pop()} on every port)")


def check_rdma_state(records: Sequence[Record]) -> Finding:
    per_node = nodes(records)
    with_ports = [r for r in per_node if _ports(r)]
    if not with_ports:
        return skip("no RDMA device (/sys/class/infiniband) on any node: NCCL uses sockets")
    down = [r for r in with_ports if not any(p.get("state") == "ACTIVE" for p in _ports(r))]
    missing = [r for r in per_node if not _ports(r)]
    if down or missing:
        parts = [f"no ACTIVE RDMA port on {_label(r)}" for r in down]
        parts += [f"no RDMA device on {_label(r)}" for r in missing]
        return fail(
            "; ".join(parts) + ": these nodes fall back to TCP sockets and the whole job runs "
            "at socket speed",
            "ibstat   # on that node: State Active, Physical state LinkUp expected\n"
            "sudo modprobe mlx5_ib   # or the NIC's RDMA driver (bnxt_re, irdma, ionic_rdma)",
        )
    return ok(f"every node has an ACTIVE RDMA port ({len(with_ports)} node(s))")


def check_gathered(records: Sequence[Record]) -> Finding:
    hosts = sorted({str(r.get("host")) for r in records})
    per_node = nodes(records)
    return ok(
        f"{len(records)} rank(s) on {len(per_node)} node(s) ({', '.join(hosts)}) reported "
        "through torch.distributed",
        ranks=len(records),
        nodes=len(per_node),
    )


CLUSTER_CHECKS: tuple[tuple[str, str, Callable[[Sequence[Record]], Finding]], ...] = (
    ("cluster.gather", "records gathered from every rank", check_gathered),
    ("cluster.versions", "same software on every node", check_versions),
    ("cluster.gpu_archs", "same GPU arch on every rank", check_gpu_archs),
    ("cluster.env", "same NCCL/RCCL environment on every rank", check_env),
    ("cluster.socket_ifname", "NCCL/gloo socket interface", check_socket_ifname),
    ("cluster.shm", "/dev/shm size", check_shm),
    ("cluster.iommu", "iommu=pt on AMD nodes", check_iommu),
    ("cluster.acs", "PCIe ACS on every node", check_acs),
    ("cluster.numa_balancing", "NUMA auto-balancing on GPU nodes", check_numa_balancing),
    ("cluster.rdma", "RDMA ports up", check_rdma_state),
    ("cluster.ib_hca", "NCCL_IB_HCA names a present, ACTIVE port", check_ib_hca),
    ("cluster.gid_index", "RoCE GID index", check_gid_index),
    ("cluster.scratch_reclaim", "HSA_NO_SCRATCH_RECLAIM on gfx90a", check_scratch_reclaim),
    ("cluster.msccl", "RCCL_MSCCL_ENABLE across nodes (AMD)", check_msccl),
)


def cluster_findings(records: Sequence[Record]) -> list[CheckResult]:
    """Every cluster check over the gathered records, in report order."""
    out = []
    for cid, title, func in CLUSTER_CHECKS:
        try:
            f = func(records)
        except Exception as exc:  # one malformed record must not hide the other findings
            f = fail(f"internal error: {type(exc).__name__}: {exc}", None)
        out.append(CheckResult(cid, title, f.status, f.finding, f.fix, f.details))
    return out
