"""Gather every evidence source through a `SystemView` into parsed records.

The only module of detection that reads the view: merging and concluding
(`greta_install.detection.detect`) work on the `Evidence` it returns. On a live machine the slow
ROCm tools run only when sysfs could not name every AMD GPU's architecture, so
``greta detect`` stays fast; a snapshot is read in full.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

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
from greta_install.detection.parsers.common import Parsed
from greta_install.detection.system_view import SystemView

KFD_NODES = "/sys/class/kfd/kfd/topology/nodes"
DRM_CLASS = "/sys/class/drm"
NVIDIA_VERSION = "/proc/driver/nvidia/version"
ROCM_VERSION_FILE = "/opt/rocm/.info/version"
AMDGPU_MODULE_VERSION = "/sys/module/amdgpu/version"
KFD_DEVICE = "/dev/kfd"

# Every source detection reports on, in the order they are read.
SOURCES: tuple[str, ...] = (
    "kfd",
    "drm",
    "lspci",
    "rocminfo",
    "rocm-smi",
    "amd-smi",
    "nvidia-smi",
    "nvidia-proc",
    "rocm-version",
    "hipconfig",
)

ToolPolicy = Literal["auto", "all"]
# Records (and KFD nodes, DRM cards) read per source. The largest machines have tens of
# GPUs; the cap keeps detection's pairwise merge bounded on a garbage snapshot.
MAX_DEVICES = 256
_CARD = re.compile(r"^card\d+$")


@dataclass
class Evidence:
    kfd: list[kfd.KfdNode] = field(default_factory=list)
    drm: list[drm.DrmCard] = field(default_factory=list)
    lspci: list[lspci.PciDevice] = field(default_factory=list)
    rocminfo: list[rocminfo.RocmAgent] = field(default_factory=list)
    rocm_smi: list[rocm_smi.RocmSmiGpu] = field(default_factory=list)
    amd_smi: list[amd_smi.AmdSmiGpu] = field(default_factory=list)
    nvidia_smi: list[nvidia_smi.NvidiaGpu] = field(default_factory=list)
    info: dict[str, str] = field(default_factory=dict)  # "<source>.<key>" -> value
    status: dict[str, str] = field(default_factory=dict)  # source -> ok/absent/garbled/...
    problems: dict[str, list[str]] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    live: bool = False


def _record(ev: Evidence, source: str, result: Parsed | None, present: bool) -> list:
    """Store a parser result's status and problems; return its records."""
    if not present or result is None:
        ev.status.setdefault(source, "absent")
        return []
    issues = result.errors + result.problems
    if issues:
        ev.problems.setdefault(source, []).extend(issues)
    for key, value in result.info.items():
        ev.info[f"{source}.{key}"] = value
    if len(result.records) > MAX_DEVICES:
        cut = f"{source}: {len(result.records)} devices; only the first {MAX_DEVICES} are read"
        issues.insert(0, cut)
        ev.problems.setdefault(source, []).insert(0, cut)
        result.records = result.records[:MAX_DEVICES]
    if not (result.records or result.info or issues):
        ev.status[source] = "empty"
    elif result.errors:
        ev.status[source] = f"error: {result.errors[0]}"
    elif result.problems:
        ev.status[source] = f"garbled: {result.problems[0]}"
    else:
        ev.status[source] = "ok"
    return list(result.records)


def _merge_results(results: list[Parsed]) -> Parsed:
    merged: Parsed = Parsed()
    for r in results:
        merged.records.extend(r.records)
        merged.problems.extend(r.problems)
        merged.errors.extend(r.errors)
        merged.info.update(r.info)
    return merged


def _node_key(name: str) -> tuple[int, str]:
    return (int(name), name) if name.isdigit() else (1 << 30, name)


def read_kfd(view: SystemView) -> tuple[Parsed[kfd.KfdNode], bool]:
    nodes = sorted(view.list_dir(KFD_NODES), key=_node_key)[:MAX_DEVICES]
    results = []
    for node in nodes:
        base = f"{KFD_NODES}/{node}"
        props = view.read_text(f"{base}/properties")
        if props is None:
            continue
        results.append(
            kfd.parse(props, node, view.read_text(f"{base}/name"), view.read_text(f"{base}/gpu_id"))
        )
    return _merge_results(results), bool(results)


def read_drm(view: SystemView) -> tuple[Parsed[drm.DrmCard], bool]:
    cards = sorted(
        (c for c in view.list_dir(DRM_CLASS) if _CARD.match(c)), key=lambda c: int(c[4:])
    )[:MAX_DEVICES]
    results = []
    for card in cards:
        files = {n: view.read_text(f"{DRM_CLASS}/{card}/device/{n}") for n in drm.CARD_FILES}
        if any(v is not None for v in files.values()):
            results.append(drm.parse_card(card, files))
    return _merge_results(results), bool(results)


def _tool(
    ev: Evidence, view: SystemView, source: str, tool: str, parse: Callable[[str | None], Parsed]
) -> list:
    text = view.run(tool)
    return _record(ev, source, parse(text) if text is not None else None, text is not None)


def _amd_arch_known(ev: Evidence) -> bool:
    """Whether sysfs alone names the architecture of every AMD GPU seen so far."""
    ids: list[str | None] = [n.device_id for n in ev.kfd if n.is_gpu and not n.gfx]
    ids += [c.device_id for c in ev.drm if c.vendor_id == 0x1002]
    ids += [d.device_id for d in ev.lspci if d.is_gpu and d.vendor_id == lspci.AMD]
    for device_id in ids:
        if not any(n.gfx and n.device_id == device_id for n in ev.kfd):
            info = pci_ids.lookup(device_id)
            if info is None or info.gfx is None:
                return False
    return True


def gather(view: SystemView, tools: ToolPolicy | None = None) -> Evidence:
    """Read and parse every source; never raises."""
    policy: ToolPolicy = tools or ("auto" if view.is_live else "all")
    ev = Evidence(env=dict(view.env()), live=view.is_live)

    result, present = read_kfd(view)
    ev.kfd = _record(ev, "kfd", result, present)
    result, present = read_drm(view)
    ev.drm = _record(ev, "drm", result, present)
    ev.lspci = _tool(ev, view, "lspci", "lspci", lspci.parse)

    amd_seen = any(n.is_gpu for n in ev.kfd) or any(c.vendor_id == 0x1002 for c in ev.drm)
    amd_seen = amd_seen or any(d.is_gpu and d.vendor_id == lspci.AMD for d in ev.lspci)
    run_rocm = (
        policy == "all"
        or (amd_seen and not _amd_arch_known(ev))
        or (not ev.kfd and not ev.drm and not ev.lspci)
    )
    if amd_seen and view.is_live:
        # sysfs shows the GPUs even in a container that was given no devices, and
        # rocminfo (which would say so) is skipped when sysfs named every GPU: ask the
        # device node itself.
        can_open = getattr(view, "can_open_rw", None)
        if not view.exists(KFD_DEVICE):
            ev.info["dev.kfd"] = "absent"
        elif can_open is not None and not can_open(KFD_DEVICE):
            ev.info["dev.kfd"] = "denied"
    if run_rocm:
        ev.rocminfo = _tool(ev, view, "rocminfo", "rocminfo", rocminfo.parse)
        ev.amd_smi = _tool(ev, view, "amd-smi", "amd-smi", amd_smi.parse)
        ev.rocm_smi = _tool(ev, view, "rocm-smi", "rocm-smi", rocm_smi.parse)
    else:
        for source in ("rocminfo", "amd-smi", "rocm-smi"):
            why = "no AMD GPU in sysfs or lspci" if not amd_seen else "sysfs named every AMD GPU"
            ev.status[source] = f"skipped: {why} (--all-tools runs it)"

    nvidia_text = view.read_text(NVIDIA_VERSION)
    driver = _record(
        ev,
        "nvidia-proc",
        nvidia_proc.parse(nvidia_text) if nvidia_text else None,
        bool(nvidia_text),
    )
    if driver:
        ev.info["nvidia-proc.driver_version"] = driver[0]
    nvidia_seen = bool(driver) or any(c.vendor_id == lspci.NVIDIA for c in ev.drm)
    nvidia_seen = nvidia_seen or any(d.vendor_id == lspci.NVIDIA and d.is_gpu for d in ev.lspci)
    if policy == "all" or nvidia_seen or not ev.lspci:
        ev.nvidia_smi = _tool(ev, view, "nvidia-smi", "nvidia-smi", nvidia_smi.parse)
        if not ev.nvidia_smi:
            plain = view.run("nvidia-smi-plain")
            if plain is not None:
                ev.status.pop("nvidia-smi", None)
                ev.problems.pop("nvidia-smi", None)
                ev.nvidia_smi = _record(ev, "nvidia-smi", nvidia_smi.parse(plain), True)
    else:
        ev.status["nvidia-smi"] = "skipped: no NVIDIA GPU in sysfs or lspci (--all-tools runs it)"

    paths = [ROCM_VERSION_FILE]
    rocm_path = ev.env.get("ROCM_PATH")
    if rocm_path and rocm_path.startswith("/"):
        paths.insert(0, rocm_path.rstrip("/") + "/.info/version")
    version_text = next((t for t in (view.read_text(p) for p in paths) if t is not None), None)
    versions = _record(
        ev,
        "rocm-version",
        rocm_version.parse_info_version(version_text) if version_text is not None else None,
        version_text is not None,
    )
    if versions:
        ev.info["rocm-version.version"] = versions[0]
        ev.status["hipconfig"] = "skipped: the ROCm version file was enough"
    elif policy == "all" or amd_seen:
        hip = _tool(ev, view, "hipconfig", "hipconfig", rocm_version.parse_hipconfig)
        if hip:
            ev.info["hipconfig.version"] = hip[0]
    else:
        ev.status["hipconfig"] = "skipped: no AMD GPU seen"

    module = (view.read_text(AMDGPU_MODULE_VERSION) or "").strip()
    if re.fullmatch(r"\d+\.\d+(?:\.\d+)*(?:[-.+]\w+)*", module):
        ev.info["amdgpu-module.version"] = module
    for source in SOURCES:
        ev.status.setdefault(source, "absent")
    return ev
