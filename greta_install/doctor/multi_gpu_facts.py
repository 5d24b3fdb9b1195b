"""What the multi_gpu.* checks read, gathered from a `SystemView` (live or snapshot).

Raw texts only: parsing happens in the checks, so a snapshot taken by an older GRETA
is judged by the newest parsers. A None is "not available here" (no such tool, no such
file, or a snapshot that did not record it); the checks then skip with that reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from greta_install.detection.system_view import (
    CMDLINE,
    NUMA_BALANCING,
    NUMA_ONLINE,
    SystemView,
    scrub_cmdline,
)

TOOLS = ("lspci-vvv", "nvidia-smi-topo", "nvidia-smi-topo-p2p", "amd-smi-topology", "rocm-smi-topo")


@dataclass(frozen=True)
class MultiGpuFacts:
    cmdline: str | None = None
    numa_balancing: str | None = None  # "0", "1" (a bitmask on newer kernels)
    numa_online: str | None = None  # "0-1"
    lspci_vvv: str | None = None
    nvidia_topo: str | None = None
    nvidia_p2p: str | None = None
    amd_topology: str | None = None
    rocm_topo: str | None = None


def _text(value: str | None) -> str | None:
    return value.strip() if value and value.strip() else None


def collect_multi_gpu(view: SystemView, gpus_seen: int) -> MultiGpuFacts:
    """Everything for a snapshot; on a live machine with fewer than two GPUs only the
    cheap files (the checks skip there anyway, and the vendor tools take seconds)."""
    cmdline = _text(view.read_text(CMDLINE))
    files = MultiGpuFacts(
        cmdline=scrub_cmdline(cmdline) if cmdline else None,
        numa_balancing=_text(view.read_text(NUMA_BALANCING)),
        numa_online=_text(view.read_text(NUMA_ONLINE)),
    )
    if view.is_live and gpus_seen < 2:
        return files
    return MultiGpuFacts(
        cmdline=files.cmdline,
        numa_balancing=files.numa_balancing,
        numa_online=files.numa_online,
        lspci_vvv=_text(view.run("lspci-vvv")),
        nvidia_topo=_text(view.run("nvidia-smi-topo")),
        nvidia_p2p=_text(view.run("nvidia-smi-topo-p2p")),
        amd_topology=_text(view.run("amd-smi-topology")),
        rocm_topo=_text(view.run("rocm-smi-topo")),
    )
