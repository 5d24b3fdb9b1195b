"""Availability checks shared by the implementations; each returns None or a reason."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any, NamedTuple

from greta_core.ops._calls import eager_raw  # noqa: F401  (the compute ops call p.eager_raw)

FLOATS = ("float16", "bfloat16", "float32", "float64")
HALF_AND_FLOAT = ("float16", "bfloat16", "float32")


class CallInfo(NamedTuple):
    """Hashable metadata of one call: what the probes decide on (no tensors kept)."""

    device: str  # torch device type: "cuda" (also ROCm) or "cpu"
    dtype: str  # "bfloat16", ...
    shapes: tuple[tuple[int, ...], ...]
    extra: tuple[Any, ...] = ()


def dtype_name(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


def info_of(*tensors: Any, extra: tuple[Any, ...] = ()) -> CallInfo:
    first = tensors[0]
    shapes = tuple(tuple(int(d) for d in t.shape) if t is not None else () for t in tensors)
    return CallInfo(first.device.type, dtype_name(first.dtype), shapes, extra)


def platform() -> str:
    """ "rocm", "cuda" or "cpu": which vendor stack a GPU tensor would use."""
    try:
        import torch
    except ImportError:
        return "cpu"
    if getattr(torch.version, "hip", None):
        return "rocm" if torch.cuda.is_available() else "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def needs_gpu(info: CallInfo) -> str | None:
    if info.device != "cuda":
        return f"needs a CUDA/ROCm GPU tensor (got {info.device})"
    return None


def dtype_in(info: CallInfo, allowed: Iterable[str], who: str) -> str | None:
    allowed = tuple(allowed)
    if info.dtype not in allowed:
        return f"{who} takes {'/'.join(allowed)} (got {info.dtype})"
    return None


@functools.lru_cache(maxsize=1)
def _greta_torch_import_error() -> str | None:
    try:
        import greta_core.torch  # noqa: F401  (registers torch.ops.greta.*)
    except Exception as exc:  # any import failure makes the GRETA kernels unavailable
        return f"greta_core.torch failed to import ({exc.__class__.__name__}: {exc})"
    return None


def greta_op(name: str) -> str | None:
    """None when ``torch.ops.greta.<name>`` is registered in this process."""
    why = _greta_torch_import_error()
    if why:
        return why
    import torch

    if not hasattr(torch.ops.greta, name):
        return f"op not registered (torch.ops.greta.{name} is not in this GRETA build)"
    return None


def first_reason(*reasons: str | None) -> str | None:
    return next((r for r in reasons if r), None)


def acc_dtype(dtype: Any) -> Any:
    """float64 stays float64; everything else computes in float32."""
    import torch

    return torch.float64 if dtype == torch.float64 else torch.float32


def unwrap(out: Any) -> Any:
    """GRETA forward ops may return (y, saved-for-backward...): keep y."""
    return out[0] if isinstance(out, (tuple, list)) else out
