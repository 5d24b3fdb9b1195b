"""One read-only view of a machine: the live system or a snapshot directory.

Every probe reads through a `SystemView`, so detection and the doctor run the same
code on this machine and on a snapshot a user attached to a bug report.

Snapshot layout (see DESIGN.md): `<tool>.txt` for each command's output
(`rocminfo.txt`, `rocm-smi.txt`, `amd-smi.txt`, `lspci.txt`, `nvidia-smi.txt`, ...),
and a `sys/`, `proc/`, `dev/`, `opt/`, `etc/` tree mirroring the absolute paths read.
`env.json` (optional) holds the relevant environment variables.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from greta_install.boundedio import read_bytes
from greta_install.errors import SnapshotNotFoundError

# Commands a view can answer; the snapshot file for each is `<name>.txt`.
TOOL_COMMANDS: dict[str, tuple[str, ...]] = {
    "rocminfo": ("rocminfo",),
    "rocm-smi": ("rocm-smi", "--showproductname", "--showhw", "--showdriverversion"),
    "amd-smi": ("amd-smi", "static"),
    # -k adds the bound kernel driver: an SR-IOV host binds its GPUs to gim or vfio-pci.
    "lspci": ("lspci", "-nn", "-D", "-k"),
    "nvidia-smi": (
        "nvidia-smi",
        "--query-gpu=index,name,pci.bus_id,pci.device_id,compute_cap,driver_version,memory.total",
        "--format=csv,noheader",
    ),
    "nvidia-smi-plain": ("nvidia-smi",),
    "hipconfig": ("hipconfig", "--version"),
    # For the multi_gpu.* doctor checks: links between GPUs, and ACS on the PCIe bridges.
    "amd-smi-topology": ("amd-smi", "topology"),
    "rocm-smi-topo": ("rocm-smi", "--showtopo"),
    "nvidia-smi-topo": ("nvidia-smi", "topo", "-m"),
    "nvidia-smi-topo-p2p": ("nvidia-smi", "topo", "-p2p", "r"),
    "lspci-vvv": ("lspci", "-vvv", "-D"),
}

# Kernel files the multi_gpu.* doctor checks read, which a snapshot copies (the tool outputs
# above go through TOOL_COMMANDS). Named here, in the view, so `greta snapshot` (detection)
# need not import the doctor.
CMDLINE = "/proc/cmdline"
NUMA_BALANCING = "/proc/sys/kernel/numa_balancing"
NUMA_ONLINE = "/sys/devices/system/node/online"
SNAPSHOT_FILES: tuple[str, ...] = (CMDLINE, NUMA_BALANCING, NUMA_ONLINE)

# root=UUID=..., resume=PARTUUID=...: identifies the user's disks, nothing the checks need.
_FS_ID = re.compile(r"\b((?:PART)?UUID=)\S+")


def scrub_cmdline(text: str) -> str:
    return _FS_ID.sub(r"\1REDACTED", text)


# Environment variables that matter to GPU selection and ROCm behaviour.
RELEVANT_ENV: tuple[str, ...] = (
    "HSA_OVERRIDE_GFX_VERSION",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "CUDA_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
    "ROCM_PATH",
    "TORCH_BLAS_PREFER_HIPBLASLT",
    "PYTORCH_ROCM_ARCH",
    "HSA_FORCE_FINE_GRAIN_PCIE",
    "NCCL_P2P_DISABLE",
    "NCCL_P2P_LEVEL",
)

MAX_READ_BYTES = 4 * 1024 * 1024  # a /sys or tool output larger than this is garbage anyway
# sysfs and procfs attributes are at most a page; a huge "properties" file is not one.
KERNEL_FILE_MAX_BYTES = 64 * 1024


class SystemView(Protocol):
    """Read-only access to a machine. Every method returns None/empty instead of raising."""

    is_live: bool

    def read_text(self, path: str) -> str | None:
        """Text of an absolute path like "/sys/class/kfd/kfd/topology/nodes/1/properties"."""

    def list_dir(self, path: str) -> list[str]:
        """Sorted entry names of an absolute directory path; [] when absent."""

    def exists(self, path: str) -> bool: ...

    def run(self, tool: str) -> str | None:
        """Output of one of TOOL_COMMANDS, or None when the tool is missing or failed."""

    def env(self) -> Mapping[str, str]:
        """The RELEVANT_ENV variables that are set."""


def _decode(data: bytes) -> str:
    return data[:MAX_READ_BYTES].decode("utf-8", errors="replace")


class _TreeView:
    """Reads files below a root directory; subclasses say what the root is.

    Regular files only, at most MAX_READ_BYTES each: a FIFO or a device where a file is
    expected reads as absent instead of hanging or filling memory.
    """

    def __init__(self, root: Path) -> None:
        self._root = root

    def _path(self, path: str) -> Path | None:
        return self._root / path.lstrip("/")

    def read_text(self, path: str) -> str | None:
        where = self._path(path)
        if where is None:
            return None
        cap = KERNEL_FILE_MAX_BYTES if path.startswith(("/sys/", "/proc/")) else MAX_READ_BYTES
        try:
            return _decode(read_bytes(where, cap, truncate=True))
        except (OSError, ValueError):
            return None

    def list_dir(self, path: str) -> list[str]:
        where = self._path(path)
        if where is None:
            return []
        try:
            return sorted(os.listdir(where))
        except OSError:
            return []

    def exists(self, path: str) -> bool:
        where = self._path(path)
        try:
            return where is not None and where.exists()
        except OSError:
            return False


class LiveSystem(_TreeView):
    """The machine this process runs on."""

    is_live = True

    def __init__(self, root: str = "/", timeout_s: float = 10.0) -> None:
        super().__init__(Path(root))
        self._timeout_s = timeout_s

    def can_open_rw(self, path: str) -> bool:
        """Whether this user may open a device node for reading and writing (/dev/kfd)."""
        where = self._path(path)
        return where is not None and os.access(where, os.R_OK | os.W_OK)

    def run(self, tool: str) -> str | None:
        argv = TOOL_COMMANDS.get(tool)
        if not argv or shutil.which(argv[0]) is None:
            return None
        try:
            proc = subprocess.run(
                list(argv),
                capture_output=True,
                timeout=self._timeout_s,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        out = _decode(proc.stdout)
        # Some tools print useful tables and still exit non-zero (e.g. no permission on
        # one device); keep the output when there is any.
        if proc.returncode != 0 and not out.strip():
            return None
        return out

    def env(self) -> Mapping[str, str]:
        return {k: os.environ[k] for k in RELEVANT_ENV if k in os.environ}


class SnapshotSystem(_TreeView):
    """A snapshot directory written by `greta snapshot` (or assembled by hand)."""

    is_live = False

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        super().__init__(Path(directory))
        self.directory = Path(directory)
        self._real_root = Path(os.path.realpath(directory))

    def _path(self, path: str) -> Path | None:
        """The file inside the snapshot, or None when it (or a symlink on the way) leads
        out of it: a snapshot is data from someone else, never a window on this machine."""
        where = self._root / path.lstrip("/")
        real = Path(os.path.realpath(where))
        if real != self._real_root and not real.is_relative_to(self._real_root):
            return None
        return real

    def run(self, tool: str) -> str | None:
        if tool not in TOOL_COMMANDS:
            return None
        return self.read_text(f"/{tool}.txt")

    def env(self) -> Mapping[str, str]:
        raw = self.read_text("/env.json")
        if not raw:
            return {}
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):  # a deeply nested file is no env either
            return {}
        if not isinstance(data, dict):
            return {}
        return {k: v for k, v in data.items() if k in RELEVANT_ENV and isinstance(v, str)}


def open_view(snapshot: str | os.PathLike[str] | None = None) -> SystemView:
    """The live machine, or the snapshot directory when one is given."""
    if snapshot is None:
        return LiveSystem()
    if not Path(snapshot).is_dir():
        raise SnapshotNotFoundError(f"snapshot directory not found: {snapshot}")
    return SnapshotSystem(snapshot)


def first_existing(view: SystemView, paths: Sequence[str]) -> str | None:
    for path in paths:
        text = view.read_text(path)
        if text is not None:
            return text
    return None
