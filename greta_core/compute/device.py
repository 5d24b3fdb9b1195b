"""The only device logic scripts need: where to run, in what dtype, and when work is done."""

from __future__ import annotations

from typing import Any

from greta_core.arch import device_arch
from greta_core.errors import GretaInputError


def default_device() -> str:
    """ "cuda" when torch sees a CUDA or ROCm GPU (ROCm torch also says "cuda"), else "cpu"."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def default_dtype(device: str | None = None) -> Any:
    """bfloat16 on a GPU that has it (float16 otherwise), float32 on the CPU."""
    import torch

    device = device or default_device()
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def resolve_dtype(name: str, device: str) -> Any:
    """ "auto" | "float32" | "bf16" ... -> torch dtype; a clear error for anything else."""
    import torch

    aliases = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32"}
    name = aliases.get(name.lower(), name.lower())
    if name == "auto":
        return default_dtype(device)
    if name not in ("float16", "bfloat16", "float32", "float64"):
        raise GretaInputError(
            f"unknown dtype {name!r}: use auto, float32, bfloat16, float16, float64"
        )
    return getattr(torch, name)


def synchronize(device: str) -> None:
    """Wait for queued GPU work (no-op on the CPU): call before reading a clock."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def describe(device: str) -> dict[str, Any]:
    """Metadata for result files: device name, torch build, GPU runtime versions."""
    import platform

    import torch

    meta: dict[str, Any] = {
        "device": device,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        meta["gpu"] = props.name
        meta["gpu_arch"] = device_arch(0)
        meta["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
    else:
        meta["gpu"] = None
        meta["cpu"] = platform.processor() or platform.machine()
    try:
        import triton

        meta["triton"] = triton.__version__
    except Exception:
        meta["triton"] = None
    return meta
