"""Row-wise ops over the last dim: rms_norm, layer_norm, softmax."""

from __future__ import annotations

from typing import Any

from greta_core.compute import _probes as p
from greta_core.compute._declared import entry
from greta_core.compute.registry import Impl, add, define
from greta_core.ops.softmax import SOFTMAX as DECL_SOFTMAX


def _vendor_label(fn: str) -> dict[str, str]:
    # No cuDNN/MIOpen routine serves these row ops in PyTorch: the framework's own kernel runs.
    return {"cuda": f"{fn} (PyTorch CUDA kernel)", "rocm": f"{fn} (PyTorch HIP kernel)", "any": fn}


def _greta_probe(name: str) -> Any:
    return lambda i: p.first_reason(
        p.greta_op(name), p.dtype_in(i, p.HALF_AND_FLOAT, f"the GRETA {name} kernel")
    )


def _vendor_probe(i: p.CallInfo) -> str | None:
    return p.first_reason(p.needs_gpu(i), p.dtype_in(i, p.FLOATS, "the framework kernel"))


def _reference_probe(i: p.CallInfo) -> str | None:
    return p.dtype_in(i, p.FLOATS, "the reference")


def _add_three(op: Any, greta: Any, vendor: Any, reference: Any, vendor_label: dict) -> None:
    add(
        op, Impl("greta", "greta", greta, _greta_probe(op.name), {"any": f"GRETA Triton {op.name}"})
    )
    add(op, Impl("vendor", "vendor", vendor, _vendor_probe, vendor_label))
    add(
        op,
        Impl("reference", "reference", reference, _reference_probe, {"any": "plain torch math"}),
    )


# --- rms_norm -------------------------------------------------------------------------


def _rms_info(x: Any, weight: Any, eps: float = 1e-6) -> p.CallInfo:
    return p.info_of(x, weight)


def _rms_greta(x: Any, weight: Any, eps: float = 1e-6) -> Any:
    import torch

    if p.eager_raw(x, weight):
        from greta_core.ops.rms_norm import rms_norm

        return rms_norm(x, weight, eps)
    return p.unwrap(torch.ops.greta.rms_norm(x, weight, eps))


def _rms_vendor(x: Any, weight: Any, eps: float = 1e-6) -> Any:
    import torch.nn.functional as F

    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def _rms_reference(x: Any, weight: Any, eps: float = 1e-6) -> Any:
    from greta_core import reference

    return reference.rms_norm(x, weight, eps)


RMS = define("rms_norm", "RMSNorm over the last dim", _rms_info)
_add_three(RMS, _rms_greta, _rms_vendor, _rms_reference, _vendor_label("F.rms_norm"))

# --- layer_norm -----------------------------------------------------------------------


def _ln_info(x: Any, weight: Any, bias: Any, eps: float = 1e-5) -> p.CallInfo:
    return p.info_of(x, weight, bias)


def _ln_greta(x: Any, weight: Any, bias: Any, eps: float = 1e-5) -> Any:
    import torch

    if p.eager_raw(x, weight, bias):
        from greta_core.ops.layer_norm import layer_norm

        return layer_norm(x, weight, bias, eps)
    return p.unwrap(torch.ops.greta.layer_norm(x, weight, bias, eps))


def _ln_vendor(x: Any, weight: Any, bias: Any, eps: float = 1e-5) -> Any:
    import torch.nn.functional as F

    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def _ln_reference(x: Any, weight: Any, bias: Any, eps: float = 1e-5) -> Any:
    from greta_core import reference

    return reference.layer_norm(x, weight, bias, eps)


LN = define("layer_norm", "LayerNorm over the last dim", _ln_info)
_add_three(LN, _ln_greta, _ln_vendor, _ln_reference, _vendor_label("F.layer_norm"))

# --- softmax: GRETA's and the reference derived from the declaration (ops/softmax.py) --


def _sm_vendor(x: Any) -> Any:
    import torch

    return torch.softmax(x, dim=-1)


SOFTMAX = entry(
    DECL_SOFTMAX,
    vendor=Impl("vendor", "vendor", _sm_vendor, _vendor_probe, _vendor_label("torch.softmax")),
)
_sm_info = SOFTMAX.info
