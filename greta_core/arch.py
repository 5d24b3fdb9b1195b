"""Which GPU architecture kernels run on, as a short name: "sm_90", "gfx942", or "cpu".

Config tables, kernel wheels and the AOT compiler all key on this name.
"""

from __future__ import annotations

import functools
import os
import re

from greta_core.errors import GretaInputError, NoGpuError
from greta_install import archs as _arch_table

# Arch names we ship tuned tables / wheels for; anything else uses "default". Read from
# the one arch table (greta_install/archs.py), which the installer half reads too.
TUNED_ARCHS: tuple[str, ...] = _arch_table.TUNED_ARCHS


def normalize_arch(name: str) -> str:
    """ "gfx942:sramecc+:xnack-" -> "gfx942"; "sm90" / "90" / "9.0" -> "sm_90"."""
    name = name.strip().lower()
    if name.startswith("gfx"):
        return name.split(":", 1)[0]
    match = re.fullmatch(r"(?:sm_?)?(\d+)(?:\.(\d+))?", name)
    if match:
        major, minor = match.groups()
        digits = f"{major}{minor}" if minor is not None else major
        return f"sm_{digits}"
    raise GretaInputError(f"unrecognised GPU arch {name!r}: expected e.g. 'gfx942' or 'sm_90'")


def is_hip(arch: str) -> bool:
    return arch.startswith("gfx")


def is_cuda(arch: str) -> bool:
    return arch.startswith("sm_")


def backend(arch: str) -> str:
    """ "hip", "cuda" or "cpu" (the Triton interpreter): a config-table feature."""
    if arch == "cpu":
        return "cpu"
    return "hip" if is_hip(arch) else "cuda"


def warp_size(arch: str) -> int:
    """Wave64 on CDNA/GCN (gfx9xx), wave32 on RDNA (gfx10xx-12xx) and NVIDIA."""
    if is_hip(arch):
        wave = _arch_table.wave_size(arch)
        if wave is not None:
            return wave
        return 64 if re.fullmatch(r"gfx9\w+", arch) else 32
    return 32


def interpreter_active() -> bool:
    """True when Triton runs kernels through its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.lru_cache(maxsize=16)
def device_arch(device_index: int = 0) -> str:
    """Arch of a visible torch GPU ("sm_90", "gfx942"); raises when torch sees none."""
    import torch

    if not torch.cuda.is_available():
        raise NoGpuError("no CUDA/ROCm GPU visible to torch")
    props = torch.cuda.get_device_properties(device_index)
    if getattr(torch.version, "hip", None):
        return normalize_arch(props.gcnArchName)
    return f"sm_{props.major}{props.minor}"


def arch_of(tensor: object) -> str:
    """Arch that a kernel launched on `tensor`'s device targets; "cpu" for host tensors."""
    device = getattr(tensor, "device", None)
    if device is None or getattr(device, "type", "cpu") != "cuda":
        return "cpu"
    return device_arch(device.index or 0)
