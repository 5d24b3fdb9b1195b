"""matmul: a[..., K] @ b[K, N] (+ bias[N])."""

from __future__ import annotations

from typing import Any

from greta_core.compute import _probes as p
from greta_core.compute.registry import Impl, add, define


def _info(a: Any, b: Any, bias: Any = None) -> p.CallInfo:
    return p.info_of(a, b, bias)


def _greta(a: Any, b: Any, bias: Any = None) -> Any:
    import torch

    if p.eager_raw(a, b, bias):
        from greta_core.ops.matmul import matmul

        return matmul(a, b, bias)
    return p.unwrap(torch.ops.greta.matmul(a, b, bias))


def _vendor(a: Any, b: Any, bias: Any = None) -> Any:
    import torch
    import torch.nn.functional as F

    if bias is None:
        return torch.matmul(a, b)
    # linear's bias goes into the BLAS-Lt epilogue instead of a separate add kernel.
    return F.linear(a, b.t(), bias)


def _reference(a: Any, b: Any, bias: Any = None) -> Any:
    from greta_core import reference

    return reference.matmul(a, b, bias)


OP = define("matmul", "GEMM a @ b (+ bias)", _info)
add(
    OP,
    Impl(
        "greta",
        "greta",
        _greta,
        lambda i: p.first_reason(
            p.greta_op("matmul"),
            p.dtype_in(i, ("float16", "bfloat16"), "the GRETA matmul kernel"),
        ),
        {"any": "GRETA Triton GEMM (torch.ops.greta.matmul)"},
    ),
)
add(
    OP,
    Impl(
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
add(
    OP,
    Impl(
        "reference",
        "reference",
        _reference,
        lambda i: p.dtype_in(i, p.FLOATS, "the reference"),
        {"any": "plain torch, float32/float64 accumulation"},
    ),
)
