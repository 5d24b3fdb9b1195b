"""Everything the checks look at, collected once (see collect.py) and passed around as data.

Checks are pure functions of a `Facts`; tests build one by hand. A field that is None
was not collected (snapshot mode, or the source was missing); checks then skip.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from greta_install.doctor.multi_gpu_facts import MultiGpuFacts
    from greta_install.environment.ptxas import PtxasFacts
    from greta_install.locks.lockfile import Lock
    from greta_install.model import Detection

ProbeOutcome = Literal["ok", "timeout", "crashed", "garbled", "not_run"]


@dataclass(frozen=True)
class ProbeResult:
    """What a framework probe subprocess gave back."""

    outcome: ProbeOutcome
    data: dict[str, Any] = field(default_factory=dict)
    returncode: int | None = None
    error: str | None = None  # why the outcome is not "ok", in words
    stderr_tail: str = ""
    seconds: float | None = None
    timeout_s: float | None = None


@dataclass(frozen=True)
class DeviceNode:
    """A device file such as /dev/kfd, as this user sees it."""

    path: str
    exists: bool
    readable: bool | None = None  # None: unknown (snapshot)
    writable: bool | None = None
    group: str | None = None  # owning group name, e.g. "render"
    mode: str | None = None  # "crw-rw----"


@dataclass(frozen=True)
class UserGroups:
    user: str | None
    effective: tuple[str, ...]  # groups of this process (os.getgroups)
    configured: tuple[str, ...]  # groups listing the user in the group database


@dataclass(frozen=True)
class ContainerInfo:
    kind: str | None  # "docker", "podman", "kubernetes", "lxc", "container"; None: not in one
    evidence: tuple[str, ...] = ()


@dataclass(frozen=True)
class InstalledDist:
    name: str  # canonical (PEP 503) name
    version: str
    provides_triton: bool = False  # installs the top-level `triton` import package
    requires: tuple[str, ...] = ()  # Requires-Dist lines


@dataclass(frozen=True)
class PythonInfo:
    version: str  # "3.11.7"
    executable: str
    prefix: str
    base_prefix: str
    conda_prefix: str | None = None
    externally_managed: bool = False  # PEP 668 marker next to the stdlib
    site_packages: str = ""  # purelib: where the frameworks and their bytecode live

    @property
    def minor(self) -> str:
        return ".".join(self.version.split(".")[:2])

    @property
    def in_venv(self) -> bool:
        return self.prefix != self.base_prefix or bool(self.conda_prefix)


@dataclass(frozen=True)
class MemoryInfo:
    """What an APU's GPU can borrow from system memory."""

    ram_bytes: int | None = None  # MemTotal
    ttm_pages_limit: int | None = None  # /sys/module/ttm/parameters/pages_limit (4 KiB pages)
    gtt_bytes: int | None = None  # amdgpu mem_info_gtt_total of the primary GPU


@dataclass
class Facts:
    live: bool
    snapshot: str | None = None
    target: str | None = None
    target_source: str | None = None  # "option" | "detection"
    detection: Detection | None = None
    detection_error: str | None = None
    lspci: str | None = None  # raw `lspci -nn` text; a second opinion beside detection
    kfd_sysfs: bool = False  # /sys/class/kfd exists: the amdgpu KFD driver is loaded
    env: dict[str, str] = field(default_factory=dict)  # effective relevant variables
    env_known: bool = True  # False in a snapshot without env.json
    python: PythonInfo | None = None
    lock: Lock | None = None
    lock_error: str | None = None
    lock_pythons: tuple[str, ...] = ()  # Python versions with a lock for this target
    device_nodes: tuple[DeviceNode, ...] | None = None
    groups: UserGroups | None = None
    container: ContainerInfo | None = None
    dists: tuple[InstalledDist, ...] | None = None
    torch_probe: ProbeResult | None = None
    jax_probe: ProbeResult | None = None
    check_index: bool = False
    index_status: dict[str, str] | None = None  # "name==version" -> found | missing | unknown: why
    backends: list[dict[str, str]] | None = None  # greta_core.backends.doctor_summary()
    multi_gpu: MultiGpuFacts | None = None  # texts the multi_gpu.* checks read
    # gfx archs the installed row's torch wheels carry (from the matrix row of the lock);
    # None when unknown. Decides whether HSA_OVERRIDE_GFX_VERSION is needed.
    wheel_archs: tuple[str, ...] | None = None
    memory: MemoryInfo | None = None  # RAM and the GPU-visible (GTT/TTM) limit
    # greta-env.json of this environment: "absent", "ok", or why it is unusable
    env_fixes: str | None = None
    # top-level framework package -> how much of it has bytecode (greta_install.environment.bytecode)
    bytecode: dict[str, Any] | None = None
    # the ptxas XLA finds first and the NVIDIA wheels' one (collected on the cuda target only)
    ptxas: PtxasFacts | None = None

    def dist(self, name: str) -> InstalledDist | None:
        for d in self.dists or ():
            if d.name == name:
                return d
        return None
