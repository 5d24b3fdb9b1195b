"""Shared by the JAX row ops: input checks and jax-triton launch arguments."""

from __future__ import annotations

from typing import Any

from greta_core.errors import GretaInputError
from greta_core.ops._rows import TRITON_DTYPE_NAMES as FLOAT_DTYPES
from greta_core.ops._rows import check_array_float as check_float
from greta_core.ops._rows import check_array_rows as check_rows

# The array checks live with the declarations, which use them too (ops import no binding).
__all__ = ["FLOAT_DTYPES", "check_float", "check_param", "check_rows", "triton_ok"]


def check_param(op: str, name: str, w: Any, x: Any) -> None:
    check_float(op, name, w)
    if w.shape != (x.shape[-1],):
        raise GretaInputError(
            f"{op}: argument '{name}' has shape {w.shape}; expected ({x.shape[-1]},)"
        )
    if str(w.dtype) not in (str(x.dtype), "float32"):
        raise GretaInputError(
            f"{op}: argument '{name}' has dtype {w.dtype}; expected {x.dtype} or float32"
        )


def triton_ok(*arrays: Any) -> bool:
    """The Triton path: jax-triton on a GPU and kernel dtypes (float64 takes the reference)."""
    from greta_core.jax._runtime import use_triton

    return all(str(a.dtype) in FLOAT_DTYPES for a in arrays) and use_triton()
