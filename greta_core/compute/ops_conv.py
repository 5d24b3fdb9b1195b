"""conv2d: no GRETA kernel; cuDNN/MIOpen through F.conv2d, else a float64/float32 reference."""

from __future__ import annotations

from typing import Any

from greta_core.compute import _probes as p
from greta_core.compute.registry import Impl, add, define


def _info(
    x: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
    groups: int = 1,
) -> p.CallInfo:  # fmt: skip
    return p.info_of(x, weight, bias)


def _vendor(
    x: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
    groups: int = 1,
) -> Any:  # fmt: skip
    import torch.nn.functional as F

    return F.conv2d(x, weight, bias, stride, padding, dilation, groups)


def _reference(
    x: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
    groups: int = 1,
) -> Any:  # fmt: skip
    import torch
    import torch.nn.functional as F

    acc = torch.float64 if x.device.type == "cpu" else torch.float32
    # cuDNN/MIOpen off: the framework's direct convolution is the independent reference.
    with torch.backends.cudnn.flags(enabled=False):
        out = F.conv2d(
            x.to(acc), weight.to(acc), None if bias is None else bias.to(acc),
            stride, padding, dilation, groups,
        )  # fmt: skip
    return out.to(x.dtype)


def _vendor_probe(i: p.CallInfo) -> str | None:
    why = p.first_reason(p.needs_gpu(i), p.dtype_in(i, p.FLOATS, "cuDNN/MIOpen conv"))
    if why:
        return why
    import torch

    if not torch.backends.cudnn.is_available():
        return "cuDNN/MIOpen not available in this torch build"
    if not torch.backends.cudnn.enabled:
        return "disabled by torch.backends.cudnn.enabled = False"
    return None


OP = define("conv2d", "2-D convolution, NCHW", _info)
add(
    OP,
    Impl(
        "vendor",
        "vendor",
        _vendor,
        _vendor_probe,
        {"cuda": "cuDNN (F.conv2d)", "rocm": "MIOpen (F.conv2d)", "any": "cuDNN/MIOpen (F.conv2d)"},
    ),
)
add(
    OP,
    Impl(
        "reference",
        "reference",
        _reference,
        lambda i: p.dtype_in(i, p.FLOATS, "the reference"),
        {"any": "F.conv2d with cuDNN/MIOpen disabled, float64 on CPU / float32 on GPU"},
    ),
)
