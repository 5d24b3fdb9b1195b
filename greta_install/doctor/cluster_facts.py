"""One node's GRETA record for `greta doctor --cluster`: what must agree between nodes.

The record is plain JSON (it travels through ``all_gather_object``): the lock row, the
versions and RECORD hashes of the stack's packages, driver and ROCm versions, the network
interfaces and RDMA ports with their GID tables (sysfs), the size of /dev/shm, the kernel
command line, NUMA and ACS state and the NCCL/RCCL/gloo environment. The torch half (torch,
CUDA/HIP, NCCL versions, GPU archs) is added by the worker, which may import torch.

Everything is read through a `SystemView`, so tests and `GRETA_CLUSTER_FIXTURE` (a directory
laid out like a snapshot whose files take precedence over the live ones, one per node) can
plant a small /dev/shm or a missing interface without root. The parsers are pure functions.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata as metadata
import os
import re
import socket
import sys
from collections.abc import Mapping
from typing import Any

from greta_install.detection.system_view import (
    CMDLINE,
    NUMA_BALANCING,
    NUMA_ONLINE,
    LiveSystem,
    SnapshotSystem,
    SystemView,
    scrub_cmdline,
)

FIXTURE_ENV = "GRETA_CLUSTER_FIXTURE"
SHM_PATH = "/dev/shm"
NET = "/sys/class/net"
IB = "/sys/class/infiniband"
ROCM_VERSION_FILES = ("/opt/rocm/.info/version", "/opt/rocm/.info/version-dev")
# Packages whose versions must agree on every node (a prefix matches a family: jax-cuda12-plugin).
STACK_PREFIXES = (
    "torch", "torchvision", "torchaudio", "triton", "pytorch-triton", "jax", "jaxlib",
    "jax-", "numpy", "greta", "nvidia-nccl", "rccl", "transformers", "vllm", "sglang",
)  # fmt: skip
# Variables that steer NCCL/RCCL/gloo/ROCr; the per-rank device selection is left out.
ENV_PREFIXES = ("NCCL_", "RCCL_", "HSA_", "GLOO_", "TORCH_NCCL_", "UCX_", "FI_", "MSCCL")
PER_RANK_ENV = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
IFF_UP = 0x1


class OverlayView:
    """A fixture directory over the live system: a file the fixture has wins."""

    def __init__(self, fixture: str | os.PathLike[str], base: SystemView) -> None:
        self.is_live = base.is_live
        self._fixture = SnapshotSystem(fixture)
        self._base = base

    def read_text(self, path: str) -> str | None:
        text = self._fixture.read_text(path)
        return text if text is not None else self._base.read_text(path)

    def list_dir(self, path: str) -> list[str]:
        return sorted({*self._fixture.list_dir(path), *self._base.list_dir(path)})

    def exists(self, path: str) -> bool:
        return self._fixture.exists(path) or self._base.exists(path)

    def run(self, tool: str) -> str | None:
        text = self._fixture.run(tool)
        return text if text is not None else self._base.run(tool)

    def env(self) -> Mapping[str, str]:
        return self._base.env()


def node_view(environ: Mapping[str, str]) -> SystemView:
    fixture = environ.get(FIXTURE_ENV)
    live = LiveSystem()
    return OverlayView(fixture, live) if fixture else live


# --- pure parsers -----------------------------------------------------------------------

_SIZE = re.compile(r"(?:^|,)size=(\d+)([kKmMgGtT%]?)(?:,|$)")
_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def shm_from_mounts(mounts: str | None, path: str = SHM_PATH) -> int | None:
    """Bytes of the tmpfs mounted at ``path`` from its ``size=`` option (/proc/mounts), or
    None: not mounted there, no size option (the kernel's default, half of RAM) or a %."""
    size = None
    for line in (mounts or "").splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[1] == path:
            m = _SIZE.search(fields[3])
            size = (
                None if not m or m.group(2) == "%" else int(m.group(1)) * _UNITS[m.group(2).lower()]
            )
    return size  # the last mount at a path is the one in effect


def first_line(text: str | None) -> str | None:
    line = (text or "").strip().splitlines()
    return line[0].strip() if line and line[0].strip() else None


_NVRM = re.compile(r"Kernel Module(?: for \S+)?\s+([\d.]+)")


def nvidia_driver(proc_version: str | None) -> str | None:
    """'550.54.15' from /proc/driver/nvidia/version."""
    m = _NVRM.search(proc_version or "")
    return m.group(1) if m else None


def after_colon(text: str | None) -> str | None:
    """'ACTIVE' from sysfs's '4: ACTIVE'."""
    value = first_line(text)
    return value.split(":", 1)[1].strip() if value and ":" in value else value


def parse_selector(value: str | None) -> tuple[bool, bool, list[tuple[str, int | None]]]:
    """NCCL's interface/HCA list syntax: (exclude, exact, [(name, port)]).

    ``^`` excludes the listed names, ``=`` matches them exactly (else each is a prefix);
    ``mlx5_0:1`` names a port of an HCA (NCCL_IB_HCA).
    """
    text = (value or "").strip()
    exclude = text.startswith("^")
    text = text[1:] if exclude else text
    exact = text.startswith("=")
    text = text[1:] if exact else text
    items: list[tuple[str, int | None]] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, _, port = part.partition(":")
        items.append((name, int(port) if port.isdigit() else None))
    return exclude, exact, items


def select(names: list[str], value: str | None) -> list[str]:
    """The names NCCL would use for a NCCL_SOCKET_IFNAME / NCCL_IB_HCA value."""
    exclude, exact, items = parse_selector(value)

    def hit(name: str) -> bool:
        return any(name == n if exact else name.startswith(n) for n, _ in items)

    return [n for n in names if hit(n) != exclude]


_SLURM_RANGE = re.compile(r"([^,\[]+)(?:\[([^\]]+)\])?")


def slurm_first_host(nodelist: str) -> str | None:
    """The first host of a Slurm node list ('gpu[03-05,07],cpu1' -> 'gpu03')."""
    m = _SLURM_RANGE.match(nodelist.strip())
    if not m:
        return None
    prefix, ranges = m.group(1), m.group(2)
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


def rendezvous_env(environ: Mapping[str, str]) -> dict[str, str] | str:
    """The env:// variables torch.distributed needs, from torchrun's or Slurm's, or why not.

    torchrun sets RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT itself. Under ``srun`` (one task
    per GPU) they come from SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID and the
    first host of SLURM_JOB_NODELIST; MASTER_PORT must then be exported by the job script.
    """
    if "RANK" in environ and "WORLD_SIZE" in environ:
        missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if not environ.get(k)]
        if missing:
            return f"RANK is set but {' and '.join(missing)} are not (start it with torchrun)"
        out = {k: environ[k] for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
        out["LOCAL_RANK"] = environ.get("LOCAL_RANK", "0")
        out["GROUP_RANK"] = environ.get("GROUP_RANK", environ.get("SLURM_NODEID", "0"))
        return out
    if "SLURM_PROCID" in environ and "SLURM_NTASKS" in environ:
        addr = environ.get("MASTER_ADDR") or slurm_first_host(
            environ.get("SLURM_JOB_NODELIST", environ.get("SLURM_NODELIST", ""))
        )
        if not addr:
            return "Slurm job without SLURM_JOB_NODELIST: export MASTER_ADDR"
        if not environ.get("MASTER_PORT"):
            return "under Slurm, export MASTER_PORT (a free TCP port on the first node) first"
        return {
            "RANK": environ["SLURM_PROCID"],
            "WORLD_SIZE": environ["SLURM_NTASKS"],
            "LOCAL_RANK": environ.get("SLURM_LOCALID", "0"),
            "GROUP_RANK": environ.get("SLURM_NODEID", "0"),
            "MASTER_ADDR": addr,
            "MASTER_PORT": environ["MASTER_PORT"],
        }
    return (
        "not started by torchrun or srun: run it as "
        "`torchrun --nnodes N --nproc-per-node 1 --rdzv-endpoint HOST:PORT -m greta doctor --cluster`"
    )


# --- collection (reads only) --------------------------------------------------------------


def _int(text: str | None) -> int | None:
    value = first_line(text)
    try:
        return int(value, 0) if value is not None else None
    except ValueError:
        return None


def collect_nics(view: SystemView) -> list[dict[str, Any]]:
    nics = []
    for name in view.list_dir(NET):
        base = f"{NET}/{name}"
        flags = _int(view.read_text(f"{base}/flags"))
        speed = _int(view.read_text(f"{base}/speed"))
        nics.append(
            {
                "name": name,
                "operstate": first_line(view.read_text(f"{base}/operstate")),
                "admin_up": None if flags is None else bool(flags & IFF_UP),
                "type": _int(view.read_text(f"{base}/type")),  # 1 ether, 32 IB, 772 loopback
                "mtu": _int(view.read_text(f"{base}/mtu")),
                "speed_mbps": speed if speed is not None and speed > 0 else None,
                "physical": view.exists(f"{base}/device"),
            }
        )
    return nics


def collect_rdma(view: SystemView) -> list[dict[str, Any]]:
    ports = []
    for dev in view.list_dir(IB):
        for port in view.list_dir(f"{IB}/{dev}/ports"):
            base = f"{IB}/{dev}/ports/{port}"
            gids = []
            for index in view.list_dir(f"{base}/gids"):
                gid = first_line(view.read_text(f"{base}/gids/{index}"))
                if not gid or set(gid) <= {"0", ":"}:
                    continue  # an empty slot of the table
                gids.append(
                    {
                        "index": int(index) if index.isdigit() else index,
                        "gid": gid,
                        "type": first_line(view.read_text(f"{base}/gid_attrs/types/{index}")),
                        "ndev": first_line(view.read_text(f"{base}/gid_attrs/ndevs/{index}")),
                    }
                )
            gids.sort(key=lambda g: g["index"] if isinstance(g["index"], int) else -1)
            ports.append(
                {
                    "device": dev,
                    "port": int(port) if port.isdigit() else port,
                    "state": after_colon(view.read_text(f"{base}/state")),
                    "phys_state": after_colon(view.read_text(f"{base}/phys_state")),
                    "link_layer": first_line(view.read_text(f"{base}/link_layer")),
                    "rate": first_line(view.read_text(f"{base}/rate")),
                    "gids": gids,
                }
            )
    return ports


def collect_shm(view: SystemView) -> dict[str, Any]:
    size = shm_from_mounts(view.read_text("/proc/mounts"))
    if size is not None:
        return {"path": SHM_PATH, "bytes": size, "source": "/proc/mounts"}
    if view.is_live:
        with contextlib.suppress(OSError):
            st = os.statvfs(SHM_PATH)
            return {"path": SHM_PATH, "bytes": st.f_blocks * st.f_frsize, "source": "statvfs"}
    return {"path": SHM_PATH, "bytes": None, "source": None}


def _stack_package(name: str) -> bool:
    return any(
        name == p or (p.endswith("-") and name.startswith(p)) or name.startswith(p + "-")
        for p in STACK_PREFIXES
    )


def collect_packages() -> dict[str, dict[str, str | None]]:
    """Versions and sha256 of the RECORD of the stack's packages (two builds of one version,
    a +cu128 and a +rocm wheel say, differ in their RECORD)."""
    from packaging.utils import canonicalize_name

    out: dict[str, dict[str, str | None]] = {}
    for dist in metadata.distributions():
        # The dist-info folder's name first: parsing every METADATA costs a second.
        folder = getattr(dist, "_normalized_name", None)
        if folder and not _stack_package(canonicalize_name(folder)):
            continue
        try:
            name = canonicalize_name(dist.metadata["Name"] or "")
        except Exception:
            continue
        if not name or name in out or not _stack_package(name):
            continue  # the first on sys.path is the one imports see
        record = None
        with contextlib.suppress(Exception):
            text = dist.read_text("RECORD")
            record = hashlib.sha256(text.encode()).hexdigest()[:16] if text else None
        out[name] = {"version": str(dist.version), "record_sha256": record}
    return dict(sorted(out.items()))


def collect_lock(view: SystemView, packages: dict[str, dict[str, str | None]]) -> dict[str, Any]:
    """The target and matrix row this environment holds, and the lock file's hash."""
    from greta_install.doctor.collect import collect_detection, installed_row
    from greta_install.doctor.facts import InstalledDist
    from greta_install.locks.lockfile import lock_filename, lock_resource_dir

    detection, error = collect_detection(view)
    target = getattr(detection, "target", None)
    out: dict[str, Any] = {"target": target, "error": error}
    if target is None:
        return out
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    with contextlib.suppress(Exception):
        dists = tuple(
            InstalledDist(name, str(p["version"]), False, ()) for name, p in packages.items()
        )
        row = installed_row(target, python, dists)
        generation = row.generation if row is not None else "current"
        name = lock_filename(target, python, generation)
        data = (lock_resource_dir() / "targets" / name).read_bytes()
        out.update(row=generation, file=name, sha256=hashlib.sha256(data).hexdigest()[:16])
    return out


def collect_acs(view: SystemView) -> list[str] | None:
    """PCIe bridges with ACS redirection on (None: lspci -vvv not available or no root)."""
    from greta_install.detection.parsers.pcie import parse_lspci_vvv

    text = view.run("lspci-vvv")
    if not text:
        return None
    bridges = [f for f in parse_lspci_vvv(text) if f.is_bridge and f.acs_ctl is not None]
    return sorted(b.bdf for b in bridges if b.acs_redirects) if bridges else None


def collect_record(environ: Mapping[str, str], view: SystemView | None = None) -> dict[str, Any]:
    """This process's node record (the torch half is added by the worker)."""
    from greta import __version__

    view = view or node_view(environ)
    cmdline = first_line(view.read_text(CMDLINE))
    rdv = rendezvous_env(environ)
    ranks = rdv if isinstance(rdv, dict) else {}
    record: dict[str, Any] = {
        "rank": int(ranks.get("RANK", 0)),
        "local_rank": int(ranks.get("LOCAL_RANK", 0)),
        "node_rank": int(ranks.get("GROUP_RANK", 0)),
        "host": socket.gethostname(),
        "greta": __version__,
        "python": ".".join(map(str, sys.version_info[:3])),
        "packages": collect_packages(),
        "driver": {
            "amdgpu": first_line(view.read_text("/sys/module/amdgpu/version")),
            "nvidia": nvidia_driver(view.read_text("/proc/driver/nvidia/version")),
        },
        "rocm": next((v for p in ROCM_VERSION_FILES if (v := first_line(view.read_text(p)))), None),
        "nics": collect_nics(view),
        "rdma": collect_rdma(view),
        "shm": collect_shm(view),
        "cmdline": scrub_cmdline(cmdline) if cmdline else None,
        "numa_balancing": first_line(view.read_text(NUMA_BALANCING)),
        "numa_online": first_line(view.read_text(NUMA_ONLINE)),
        "env": {
            k: v
            for k, v in sorted(environ.items())
            if k.startswith(ENV_PREFIXES) and k not in PER_RANK_ENV
        },
        "visible_devices": {k: environ[k] for k in PER_RANK_ENV if k in environ},
    }
    with contextlib.suppress(Exception):
        record["lock"] = collect_lock(view, record["packages"])
    with contextlib.suppress(Exception):
        record["acs_redirecting"] = collect_acs(view)
    return record
