"""greta_core.compile: MIGraphX on ROCm, TensorRT on CUDA, else torch.compile's default.

The choice is reported (``.backend``, ``.reason``) and can be forced with ``backend=`` or
``GRETA_COMPILE_BACKEND``; a forced backend that is not installed raises
GretaUnavailableError instead of quietly using another.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
from typing import Any

from greta_core.errors import GretaInputError, GretaUnavailableError

ENV = "GRETA_COMPILE_BACKEND"
# GRETA name -> (module to import so it registers itself, torch.compile backend string)
BACKENDS: dict[str, tuple[str | None, str]] = {
    "migraphx": ("torch_migraphx", "migraphx"),
    "tensorrt": ("torch_tensorrt", "tensorrt"),
    "inductor": (None, "inductor"),
    "aot_eager": (None, "aot_eager"),
}


def _platform() -> str:
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    return "rocm" if getattr(torch.version, "hip", None) else "cuda"


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def unavailable_reason(name: str, platform: str) -> str | None:
    module, _ = BACKENDS[name]
    if name == "migraphx" and platform != "rocm":
        return f"MIGraphX needs a ROCm GPU (this is {platform})"
    if name == "tensorrt" and platform != "cuda":
        return f"TensorRT needs an NVIDIA GPU (this is {platform})"
    if module and not _has(module):
        return f"{module} is not installed"
    if (
        name == "inductor"
        and platform == "cpu"
        and not any(
            shutil.which(c) for c in (os.environ.get("CXX", ""), "c++", "g++", "clang++") if c
        )
    ):
        return "inductor on the CPU needs a C++ compiler (none on PATH)"
    return None


def choose_backend(requested: str | None = None) -> tuple[str, str]:
    """(backend, why) for this machine; `requested` (or GRETA_COMPILE_BACKEND) forces one."""
    platform = _platform()
    requested = (requested or os.environ.get(ENV, "") or "auto").lower()
    if requested != "auto":
        if requested not in BACKENDS:
            raise GretaInputError(
                f"unknown compile backend {requested!r}: auto, {', '.join(BACKENDS)}"
            )
        why = unavailable_reason(requested, platform)
        if why:
            raise GretaUnavailableError("compile", requested, why)
        return requested, "forced"
    order = [
        *{"rocm": ["migraphx"], "cuda": ["tensorrt"]}.get(platform, []),
        "inductor",
        "aot_eager",
    ]
    skipped = []
    for name in order:
        why = unavailable_reason(name, platform)
        if why is None:
            note = f"; skipped {', '.join(skipped)}" if skipped else ""
            return name, f"first available on {platform}{note}"
        skipped.append(f"{name} ({why})")
    return "aot_eager", "nothing else available"


class Compiled:
    """A compiled module/function that says which compiler produced it."""

    def __init__(self, original: Any, compiled: Any, backend: str, reason: str) -> None:
        self.original = original
        self.compiled = compiled
        self.backend = backend
        self.reason = reason

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.compiled(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Compiled(backend={self.backend!r}, reason={self.reason!r})"


def compile(module: Any, backend: str | None = None, **options: Any) -> Compiled:
    """Compile `module` (nn.Module or function) with the best graph compiler here."""
    import torch

    name, reason = choose_backend(backend)
    module_name, torch_backend = BACKENDS[name]
    if module_name:
        importlib.import_module(module_name)  # registers the torch.compile backend
    compiled = torch.compile(module, backend=torch_backend, **options)
    return Compiled(module, compiled, name, reason)
