"""Shared by the JAX row ops: input checks (one copy, ``ops/_rows.py``) and the Triton rule."""

from __future__ import annotations

from typing import Any

from greta_core.ops._rows import TRITON_DTYPE_NAMES as FLOAT_DTYPES
from greta_core.ops._rows import check_array_float as check_float
from greta_core.ops._rows import check_array_param as check_param
from greta_core.ops._rows import check_array_rows as check_rows

__all__ = ["FLOAT_DTYPES", "check_float", "check_param", "check_rows", "triton_ok"]


def triton_ok(*arrays: Any) -> bool:
    """The Triton path: jax-triton on a GPU and kernel dtypes (float64 takes the reference)."""
    from greta_core.jax._runtime import use_triton

    return all(str(a.dtype) in FLOAT_DTYPES for a in arrays) and use_triton()
