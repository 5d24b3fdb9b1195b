"""multi_gpu.*: the machine settings that make NCCL/RCCL collectives hang or crawl.

Each check reads the raw texts in ``facts.multi_gpu`` (see multi_gpu_facts.py), so it
runs the same on a live machine and on a snapshot. All of them skip on one GPU.
`greta doctor --collective` points at these checks when an all-reduce hangs or sums wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from greta_install.detection.parsers.pcie import PciFunction, bridges_above, parse_lspci_vvv
from greta_install.detection.parsers.topology import (
    Pair,
    Topology,
    parse_amd_topology,
    parse_nvidia_p2p,
    parse_nvidia_topo,
)
from greta_install.doctor.facts import Facts
from greta_install.doctor.model import Finding, fail, ok, skip, warn
from greta_install.doctor.multi_gpu_facts import MultiGpuFacts

from ._common import amd_gpu_expected, detection_gpus, lspci_gpus, nvidia_gpu_expected

GRUB_FIX = (
    "sudoedit /etc/default/grub   # add {param} to GRUB_CMDLINE_LINUX_DEFAULT\n"
    "sudo update-grub && sudo reboot   # RHEL/SUSE: sudo grub2-mkconfig -o /boot/grub2/grub.cfg"
)
NUMA_FIX = (
    "sudo sysctl -w kernel.numa_balancing=0\n"
    "echo kernel.numa_balancing=0 | sudo tee /etc/sysctl.d/90-greta-numa.conf   # keep it"
)
VISIBLE_VARS = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
# Cards whose NVLink/XGMI is on the board, so a PCIe-only matrix means a link is down.
_NVLINK_BOARDS = re.compile(r"SXM|HGX|H100 80GB HBM3|H200(?! NVL)|B200|B100|GB200", re.I)
# Eight-way XGMI boards. MI300A shares gfx942 but is an APU of up to four per node.
_MI300_CLASS = re.compile(r"MI300X|MI325X|MI308X|MI355X|MI350X", re.I)
_MI300_ARCH = re.compile(r"gfx942|gfx950")
_CONSUMER = re.compile(r"GeForce|RTX \d{4}\b|Radeon RX|Radeon\(TM\) RX", re.I)


@dataclass(frozen=True)
class View:
    """The parsed inputs every multi_gpu check starts from."""

    vendor: str | None  # "amd" | "nvidia"
    count: int  # GPUs seen by any source (0: none)
    topo: Topology | None
    raw: MultiGpuFacts
    products: tuple[str, ...]
    live: bool = True


def _products(facts: Facts) -> tuple[str, ...]:
    names = [
        f"{getattr(g, 'product', '') or ''} {getattr(g, 'arch', '') or ''}"
        for g in detection_gpus(facts)
    ]
    names += [d.line for d in lspci_gpus(facts.lspci)]
    return tuple(n for n in names if n.strip())


def view_of(facts: Facts) -> View:
    raw = facts.multi_gpu or MultiGpuFacts()
    nv = parse_nvidia_topo(raw.nvidia_topo)
    amd = parse_amd_topology(raw.amd_topology, raw.rocm_topo)
    if amd is not None and (nv is None or amd_gpu_expected(facts)):
        vendor, topo = "amd", amd
    elif nv is not None:
        vendor, topo = "nvidia", nv
    else:
        topo = None
        vendor = (
            "amd" if amd_gpu_expected(facts) else "nvidia" if nvidia_gpu_expected(facts) else None
        )
    discrete = [
        g
        for g in detection_gpus(facts)
        if not getattr(g, "integrated", False) and getattr(g, "usable", True)
    ]
    count = max(len(discrete), topo.count if topo else 0)
    if count == 0:
        pci = [f for f in parse_lspci_vvv(raw.lspci_vvv) if f.is_gpu]
        count = max(len(lspci_gpus(facts.lspci)), len(pci))
    return View(vendor, count, topo, raw, _products(facts), facts.live)


def _one_gpu(v: View) -> Finding | None:
    if v.count >= 2:
        return None
    if v.count == 1:
        return skip("one GPU: collectives between GPUs do not apply")
    return skip("no GPU found" if v.live else "this snapshot records no GPU")


def _pairs_text(pairs: list[Pair], limit: int = 4) -> str:
    shown = ", ".join(f"{i}-{j}" for i, j in pairs[:limit])
    return shown + (f" and {len(pairs) - limit} more" if len(pairs) > limit else "")


# --- kernel command line ------------------------------------------------------------


def check_iommu(facts: Facts) -> Finding:
    v = view_of(facts)
    if (s := _one_gpu(v)) is not None:
        return s
    if v.raw.cmdline is None:
        return skip("kernel command line not available (/proc/cmdline)")
    params = dict(p.split("=", 1) if "=" in p else (p, "") for p in v.raw.cmdline.split())
    iommu = params.get("iommu")
    off = iommu == "off" or "off" in (params.get("amd_iommu"), params.get("intel_iommu"))
    if iommu == "pt":
        return ok("iommu=pt: the IOMMU passes GPU peer traffic through", cmdline=v.raw.cmdline)
    if off:
        return ok("IOMMU off on the kernel command line", cmdline=v.raw.cmdline)
    if v.vendor == "amd":
        return warn(
            "the kernel command line lacks iommu=pt: RCCL warns 'Missing \"iommu=pt\"' and "
            "multi-GPU all-reduces are reported to hang until it is set (a kernel built with "
            "CONFIG_IOMMU_DEFAULT_PASSTHROUGH=y is already in passthrough)",
            GRUB_FIX.format(param="iommu=pt"),
            cmdline=v.raw.cmdline,
        )
    translated = [k for k in ("amd_iommu", "intel_iommu") if params.get(k) == "on"]
    if translated:
        return warn(
            f"{translated[0]}=on without iommu=pt: peer-to-peer DMA between GPUs is "
            "translated by the IOMMU, which NCCL's troubleshooting guide names as a cause "
            "of hangs and low bandwidth",
            GRUB_FIX.format(param="iommu=pt"),
            cmdline=v.raw.cmdline,
        )
    return ok("no IOMMU translation requested on the kernel command line", cmdline=v.raw.cmdline)


# --- PCIe ACS -------------------------------------------------------------------------


def check_acs(facts: Facts) -> Finding:
    v = view_of(facts)
    if (s := _one_gpu(v)) is not None:
        return s
    if v.raw.lspci_vvv is None:
        return skip("no `lspci -vvv` output")
    functions = parse_lspci_vvv(v.raw.lspci_vvv)
    bridges = [f for f in functions if f.is_bridge]
    gpus = [f for f in functions if f.is_gpu]
    above: dict[str, PciFunction] = {}
    for gpu in gpus:
        above.update((b.bdf, b) for b in bridges_above(functions, gpu))
    scope = "above the GPUs"
    if not above:
        # Partial output: no GPU lines or no bus ranges. NCCL's guide asks for ACS off on
        # every bridge, so judge them all.
        above, scope = {b.bdf: b for b in bridges}, "(which sit above the GPUs is unknown)"
    read = [b for b in above.values() if b.acs_ctl is not None]
    if not read:
        if any(f.caps_denied for f in functions):
            return skip(
                "lspci ran without root, so the ACS registers were not readable: "
                "run `sudo greta doctor` or `sudo lspci -vvv | grep ACSCtl`"
            )
        return ok(f"no bridge {scope} has an ACS capability", bridges=sorted(above))
    redirecting = sorted(b.bdf for b in read if b.acs_redirects)
    if not redirecting:
        return ok(f"ACS is off on the {len(read)} bridge(s) {scope}", bridges=sorted(above))
    bdfs = " ".join(b.split(":", 1)[1] for b in redirecting)
    return fail(
        f"PCIe ACS is on for {len(redirecting)} bridge(s) {scope} ({', '.join(redirecting)}): "
        "peer-to-peer traffic is routed up to the root complex, where NCCL/RCCL collectives "
        "deadlock or crawl (on a virtualization host ACS isolates passed-through devices; "
        "keep it there)",
        f"for b in {bdfs}; do sudo setpci -s $b ECAP_ACS+6.w=0000; done   # until reboot\n"
        "disable ACS (or 'PCIe ACS control') in the BIOS to make it permanent",
        bridges=redirecting,
    )


# --- fine-grain PCIe vs link type (AMD) --------------------------------------------------


def check_fine_grain(facts: Facts) -> Finding:
    v = view_of(facts)
    if (s := _one_gpu(v)) is not None:
        return s
    if v.vendor != "amd":
        return skip("HSA_FORCE_FINE_GRAIN_PCIE is an AMD (ROCr) setting")
    if v.topo is None:
        return skip("no `amd-smi topology` / `rocm-smi --showtopo` output")
    value = facts.env.get("HSA_FORCE_FINE_GRAIN_PCIE")
    pcie = v.topo.pairs_of("pcie")
    if not pcie:
        note = " (set, harmless)" if value else ""
        return ok(f"all GPU pairs use XGMI: fine-grain PCIe memory is not needed{note}")
    if not facts.env_known:
        return skip("this snapshot did not record the environment (env.json)")
    if value == "1":
        return ok(f"HSA_FORCE_FINE_GRAIN_PCIE=1 for the {len(pcie)} PCIe GPU pair(s)")
    return warn(
        f"GPU pairs {_pairs_text(pcie)} talk over PCIe and HSA_FORCE_FINE_GRAIN_PCIE is "
        f"{'unset' if value is None else repr(value)}: RCCL warns this 'can lead to low RCCL "
        "performance, system instability or hang'",
        "export HSA_FORCE_FINE_GRAIN_PCIE=1",
        pcie_pairs=len(pcie),
    )


# --- XGMI / NVLink status -------------------------------------------------------------------


def _linked_group(topo: Topology, kind: str) -> list[int]:
    """The largest set of GPUs one GPU reaches directly over ``kind`` links (itself included)."""
    best: list[int] = []
    for start in range(topo.count):
        group = [start] + [
            j
            for j in range(topo.count)
            if j != start and topo.kinds.get((min(start, j), max(start, j))) == kind
        ]
        if len(group) > len(best):
            best = sorted(group)
    return best


def _eight_way(products: tuple[str, ...]) -> bool:
    if any(_MI300_CLASS.search(p) for p in products):
        return True
    return any(_MI300_ARCH.search(p) for p in products) and not any("MI300A" in p for p in products)


def check_links(facts: Facts) -> Finding:
    v = view_of(facts)
    if (s := _one_gpu(v)) is not None:
        return s
    if v.topo is None:
        return skip(
            "no topology output (amd-smi topology, rocm-smi --showtopo or nvidia-smi topo -m)"
        )
    topo = v.topo
    fast = "nvlink" if topo.source.startswith("nvidia") else "xgmi"
    label = "NVLink" if fast == "nvlink" else "XGMI"
    pairs = topo.pairs()
    linked = topo.pairs_of(fast)
    details = {"source": topo.source, "pairs": len(pairs), "linked": len(linked)}
    env_var = "CUDA_VISIBLE_DEVICES" if fast == "nvlink" else "HIP_VISIBLE_DEVICES"
    if linked and len(linked) < len(pairs):
        group = _linked_group(topo, fast)
        return warn(
            f"{label} joins {len(linked)} of {len(pairs)} GPU pairs; the others "
            f"({_pairs_text([p for p in pairs if p not in linked])}) go over PCIe, and a "
            "collective over all GPUs runs at the slowest link's speed",
            f"{env_var}={','.join(map(str, group))}   # keep each tensor-parallel group on "
            f"{label}-joined GPUs",
            **details,
        )
    if not linked:
        if any(_NVLINK_BOARDS.search(p) for p in v.products):
            return fail(
                f"these GPUs have {label} on the board but every pair reports PCIe: the links "
                "are down or the fabric is not initialised",
                "nvidia-smi nvlink --status\n"
                "sudo systemctl restart nvidia-fabricmanager   # NVSwitch systems",
                **details,
            )
        return ok(f"no {label}: the {topo.count} GPUs talk over PCIe", **details)
    if fast == "xgmi" and _eight_way(v.products) and topo.count < 8:
        return warn(
            f"{topo.count} MI300-class GPUs: each has 7 XGMI links, one per peer of an 8-GPU "
            f"node, so {topo.count} GPUs use {topo.count - 1} of them and collectives reach "
            f"about {topo.count - 1}/7 of the 8-GPU bus bandwidth",
            "use all 8 GPUs of the node for bandwidth-bound collectives (unset "
            "HIP_VISIBLE_DEVICES), or expect the lower bus bandwidth",
            **details,
        )
    shown = topo.raw[linked[0]]
    kind = label if shown.upper() == label.upper() else f"{label} ({shown})"
    return ok(f"all {len(pairs)} GPU pairs use {kind}", **details)


# --- NUMA -------------------------------------------------------------------------------------


def check_numa_balancing(facts: Facts) -> Finding:
    v = view_of(facts)
    if (s := _one_gpu(v)) is not None:
        return s
    value = v.raw.numa_balancing
    if value is None:
        return skip("/proc/sys/kernel/numa_balancing not available")
    if value == "0":
        return ok("NUMA auto-balancing is off")
    return warn(
        f"NUMA auto-balancing is on (kernel.numa_balancing={value}): the kernel keeps "
        "unmapping pages to migrate them, which AMD's MI300X tuning guide and RCCL name as "
        "a cause of slow collectives",
        NUMA_FIX,
        value=value,
    )


def _nodes(spec: str | None) -> int | None:
    """Count of NUMA nodes in a kernel list like "0-1" or "0,2-3"."""
    if not spec:
        return None
    total = 0
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        try:
            total += int(hi or lo) - int(lo) + 1
        except ValueError:
            return None
    return total


def check_numa_placement(facts: Facts) -> Finding:
    v = view_of(facts)
    if (s := _one_gpu(v)) is not None:
        return s
    if v.topo is None:
        return skip("no topology output to place the GPUs on NUMA nodes")
    topo = v.topo
    numa = {i: n for i, n in topo.numa.items() if i < topo.count}
    machine_nodes = _nodes(v.raw.numa_online)
    unknown = sorted(i for i, n in numa.items() if n is None)
    if unknown and len(numa) == topo.count and (machine_nodes or 0) > 1:
        return warn(
            f"the firmware reports no NUMA node for GPU(s) {unknown} on a {machine_nodes}-node "
            "machine: NCCL/RCCL cannot pin their helper threads near the GPUs",
            "enable the ACPI SRAT/NUMA-per-socket setting in the BIOS; meanwhile pin each "
            "rank with numactl --cpunodebind=N --membind=N",
        )
    cross = topo.cross_socket()
    nodes = sorted({n for n in numa.values() if n is not None})
    placement = {str(n): [i for i, m in numa.items() if m == n] for n in nodes}
    if cross:
        first = placement.get(str(nodes[0])) if nodes else None
        keep = ",".join(map(str, first)) if first else "<the GPUs of one NUMA node>"
        env_var = "CUDA_VISIBLE_DEVICES" if v.vendor == "nvidia" else "HIP_VISIBLE_DEVICES"
        return warn(
            f"GPU pairs {_pairs_text(cross)} reach each other only across NUMA nodes over the "
            "CPU interconnect: collectives spanning them are bounded by that link",
            f"{env_var}={keep}   # one socket's GPUs per job, pinned with numactl "
            f"--cpunodebind={nodes[0] if nodes else 0}",
            numa=placement,
        )
    if not nodes:
        return skip(f"{topo.source} gives no NUMA placement for the GPUs")
    if len(nodes) > 1:
        return ok(
            f"GPUs sit on NUMA nodes {nodes}; GPU-to-GPU traffic stays on GPU links",
            numa=placement,
        )
    return ok(f"all {topo.count} GPUs on NUMA node {nodes[0]}", numa=placement)


# --- visible-devices variables ---------------------------------------------------------------


def _devices(value: str) -> list[str]:
    return [t.strip() for t in value.split(",") if t.strip()]


def check_visible_devices(facts: Facts) -> Finding:
    if not facts.env_known:
        return skip("this snapshot did not record the environment (env.json)")
    v = view_of(facts)
    # CUDA reads only CUDA_VISIBLE_DEVICES; ROCm reads all three.
    relevant = VISIBLE_VARS[2:] if v.vendor == "nvidia" else VISIBLE_VARS
    env = {k: facts.env[k] for k in relevant if k in facts.env}
    if not env:
        return ok("no *_VISIBLE_DEVICES variable set: every GPU is visible")
    problems: list[str] = []
    fixes: list[str] = []
    for name, value in env.items():
        tokens = _devices(value)
        if not tokens or tokens == ["-1"]:
            problems.append(f"{name}={value!r} hides every GPU")
            fixes.append(f"unset {name}")
        elif len(set(tokens)) != len(tokens):
            problems.append(f"{name}={value} lists a device twice")
            fixes.append(f"export {name}={','.join(dict.fromkeys(tokens))}")
    hip, cuda = env.get("HIP_VISIBLE_DEVICES"), env.get("CUDA_VISIBLE_DEVICES")
    if v.vendor == "amd" and hip is not None and cuda is not None and hip != cuda:
        problems.append(
            f"HIP_VISIBLE_DEVICES={hip} and CUDA_VISIBLE_DEVICES={cuda} disagree: HIP obeys "
            "one, tools that read the other (Ray refuses to start) see different GPUs"
        )
        fixes.append("unset CUDA_VISIBLE_DEVICES   # keep only HIP_VISIBLE_DEVICES")
    # Index bounds: ROCR filters first; HIP/CUDA then index what ROCR left visible.
    available = v.count
    rocr = env.get("ROCR_VISIBLE_DEVICES") if v.vendor == "amd" else None
    if rocr is not None and available:
        bad = [t for t in _devices(rocr) if t.isdigit() and int(t) >= available]
        if bad:
            problems.append(f"ROCR_VISIBLE_DEVICES names GPU {bad[0]} of {available}")
            fixes.append(f"export ROCR_VISIBLE_DEVICES={','.join(map(str, range(available)))}")
        available = len(_devices(rocr)) or available
    for name in ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):  # only CUDA's on NVIDIA
        value = env.get(name)
        if value is None or not available:
            continue
        bad = [t for t in _devices(value) if t.isdigit() and int(t) >= available]
        if bad:
            problems.append(
                f"{name}={value} names device {bad[0]} but only {available} are visible "
                "('invalid device ordinal')"
            )
            fixes.append(f"export {name}={','.join(map(str, range(available)))}")
    if problems:
        return fail("; ".join(problems), "\n".join(dict.fromkeys(fixes)), variables=env)
    shown = " ".join(f"{k}={val}" for k, val in env.items())
    return ok(f"{shown}: consistent", variables=env)


# --- peer-to-peer settings -------------------------------------------------------------------


def check_p2p(facts: Facts) -> Finding:
    v = view_of(facts)
    if (s := _one_gpu(v)) is not None:
        return s
    if not facts.env_known:
        return skip("this snapshot did not record the environment (env.json)")
    disabled = facts.env.get("NCCL_P2P_DISABLE") == "1"
    fast = bool(v.topo and (v.topo.pairs_of("nvlink") or v.topo.pairs_of("xgmi")))
    if disabled and fast:
        return warn(
            "NCCL_P2P_DISABLE=1 on GPUs joined by NVLink/XGMI: collectives go through host "
            "memory instead of the GPU links",
            "unset NCCL_P2P_DISABLE",
        )
    if disabled:
        return ok("NCCL_P2P_DISABLE=1: peer-to-peer off (collectives staged through the host)")
    matrix = parse_nvidia_p2p(v.raw.nvidia_p2p) or {}
    refused = sorted({s for s in matrix.values() if s != "OK"})
    if matrix and refused and not fast:
        return ok(
            f"the driver reports no PCIe peer access ({'/'.join(refused)}): NCCL stages "
            "through host memory by itself, NCCL_P2P_DISABLE is not needed"
        )
    consumer = any(_CONSUMER.search(p) for p in v.products) or (
        v.vendor == "amd" and facts.target == "radeon"
    )
    if consumer and not fast:
        return warn(
            "consumer GPUs with peer-to-peer over PCIe: pairs of GeForce and Radeon cards "
            "are reported to hang in all-reduce until P2P is disabled",
            "greta doctor --collective   # if it hangs: export NCCL_P2P_DISABLE=1",
        )
    return ok("peer-to-peer left to NCCL/RCCL (NCCL_P2P_DISABLE not set)")
