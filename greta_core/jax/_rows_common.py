"""Shared by the JAX row ops: input checks and jax-triton launch arguments."""

from __future__ import annotations

from typing import Any

from greta_core.errors import GretaInputError

FLOAT_DTYPES = ("float32", "float16", "bfloat16")


def check_float(op: str, name: str, a: Any, reference_ok: bool = True) -> None:
    allowed = (*FLOAT_DTYPES, "float64") if reference_ok else FLOAT_DTYPES
    if not hasattr(a, "shape") or not hasattr(a, "dtype"):
        raise GretaInputError(f"{op}: argument '{name}' must be an array, got {type(a).__name__}")
    if str(a.dtype) not in allowed:
        raise GretaInputError(
            f"{op}: argument '{name}' has dtype {a.dtype}; expected one of: {', '.join(allowed)}"
        )


def check_rows(op: str, name: str, x: Any) -> None:
    check_float(op, name, x)
    if x.ndim < 1 or x.shape[-1] == 0:
        raise GretaInputError(f"{op}: argument '{name}' needs a non-empty last dim, got {x.shape}")


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
