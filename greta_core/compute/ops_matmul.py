"""matmul: a[..., K] @ b[K, N] (+ bias[N]); GRETA's and the reference derived from the
declaration (greta_core/ops/matmul.py)."""

from __future__ import annotations

from typing import Any

from greta_core.compute import _probes as p
from greta_core.compute._declared import entry
from greta_core.compute.registry import Impl
from greta_core.ops.matmul import MATMUL


def _vendor(a: Any, b: Any, bias: Any = None) -> Any:
    import torch
    import torch.nn.functional as F

    if bias is None:
        return torch.matmul(a, b)
    # linear's bias goes into the BLAS-Lt epilogue instead of a separate add kernel.
    return F.linear(a, b.t(), bias)


OP = entry(
    MATMUL,
    "plain torch, float32/float64 accumulation",
    greta_label="GRETA Triton GEMM (torch.ops.greta.matmul)",
    vendor=Impl(
        "vendor",
        "vendor",
        _vendor,
        lambda i: p.first_reason(p.needs_gpu(i), p.dtype_in(i, p.FLOATS, "BLAS")),
        {
            "cuda": "cuBLAS / cuBLASLt (torch.matmul)",
            "rocm": "hipBLASLt / rocBLAS (torch.matmul)",
            "any": "vendor BLAS (torch.matmul)",
        },
    ),
)
_info = OP.info
