"""Plain data shared by detection, planning and the doctor.

Pure data, no I/O: every module that reasons about the machine takes and returns
these, so they can be built from snapshots in tests.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Vendor = Literal["amd", "nvidia"]
Target = Literal["mi300x", "radeon", "instinct", "cuda", "cpu"]
# "none": no GPU at all; "unusable": a GPU is there but nothing here can compute on it
# (driver not loaded, /dev/kfd not permitted, a container without the devices, a host
# that passes it to VMs); "usable": some GPU can run.
DeviceState = Literal["none", "unusable", "usable"]
TARGETS: tuple[Target, ...] = ("mi300x", "radeon", "instinct", "cuda", "cpu")


@dataclass(frozen=True)
class Gpu:
    """One GPU as detection sees it, merged from every evidence source."""

    vendor: Vendor
    arch: str | None  # "gfx942", "gfx1100", "sm_90"; None when no source could tell
    product: str | None  # marketing name, e.g. "AMD Instinct MI300X"
    pci_id: str | None  # device id as "0x74a1" (lower case)
    integrated: bool = False  # APU / iGPU sharing system memory
    evidence: tuple[str, ...] = ()  # sources that contributed: "kfd", "drm", "lspci", ...
    pci_bus: str | None = None  # "0000:c1:00.0" when known
    vram_bytes: int | None = None
    gtt_bytes: int | None = None
    compute_units: int | None = None
    usable: bool = True  # False e.g. for an SR-IOV PF bound to the host's GIM driver
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["evidence"] = list(self.evidence)
        return data


@dataclass
class Detection:
    """What `greta detect` concludes about a machine."""

    target: Target
    # Index into gpus of the GPU detection chose; None when there is none. On a cpu
    # target it may still name a GPU GRETA has no target for (e.g. gfx906), to show it.
    primary: int | None
    gpus: list[Gpu] = field(default_factory=list)
    rocm_version: str | None = None
    driver_version: str | None = None  # NVIDIA driver or amdgpu driver version
    cuda_version: str | None = None  # CUDA version the NVIDIA driver supports
    env: dict[str, str] = field(default_factory=dict)  # environment fixes this machine needs
    env_seen: dict[str, str] = field(default_factory=dict)  # relevant variables already set
    warnings: list[str] = field(default_factory=list)
    sources: dict[str, str] = field(
        default_factory=dict
    )  # source -> "ok" | "absent" | "garbled: ..."
    state: DeviceState = "none"
    # In the "unusable" state: what stops programs here, each with the fix to type.
    blockers: list[str] = field(default_factory=list)

    @property
    def primary_gpu(self) -> Gpu | None:
        if self.primary is None or not (0 <= self.primary < len(self.gpus)):
            return None
        return self.gpus[self.primary]

    @property
    def arch(self) -> str | None:
        gpu = self.primary_gpu
        return gpu.arch if gpu else None

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "primary": self.primary,
            "arch": self.arch,
            "gpus": [g.to_json() for g in self.gpus],
            "rocm_version": self.rocm_version,
            "driver_version": self.driver_version,
            "cuda_version": self.cuda_version,
            "env": dict(self.env),
            "env_seen": dict(self.env_seen),
            "warnings": list(self.warnings),
            "sources": dict(self.sources),
            "state": self.state,
            "blockers": list(self.blockers),
        }
