"""Validation and reshaping shared by the row-wise launchers (norms, softmax)."""

from __future__ import annotations

from typing import Any

from greta_core.ops._validate import GretaInputError, check_tensor, launch_arch

TRITON_DTYPE_NAMES = ("float32", "float16", "bfloat16")


def float_dtypes(reference: bool = False) -> tuple[Any, ...]:
    """Kernel dtypes; the torch reference path also takes float64 (gradcheck)."""
    import torch

    kernel = (torch.float32, torch.float16, torch.bfloat16)
    return (*kernel, torch.float64) if reference else kernel


def check_rows_input(op: str, name: str, x: Any, reference: bool = False) -> None:
    """x: [..., N] with N >= 1, fp32/fp16/bf16, last dim contiguous."""
    check_tensor(op, name, x, dtypes=float_dtypes(reference))
    if x.dim() < 1 or x.shape[-1] == 0:
        raise GretaInputError(
            f"{op}: argument '{name}' needs a non-empty last dim, got shape {tuple(x.shape)}"
        )
    if x.dim() > 0 and x.stride(-1) != 1 and x.shape[-1] > 1:
        raise GretaInputError(
            f"{op}: argument '{name}' must be contiguous in its last dim (call .contiguous())"
        )


def check_vector(op: str, name: str, w: Any, n: int, dtypes: tuple[Any, ...]) -> None:
    check_tensor(op, name, w, dtypes=dtypes, ndim=1, contiguous=True)
    if w.shape[0] != n:
        raise GretaInputError(
            f"{op}: argument '{name}' has shape {tuple(w.shape)}; expected ({n},) "
            "(the size of the last dim of x)"
        )


def arch_for(op: str, x: Any, reference: bool) -> str:
    """The launch arch; "reference" when only the torch reference will run."""
    return "reference" if reference else launch_arch(op, x)


def rows_view(x: Any) -> Any:
    """[..., N] -> [rows, N]; a copy only when the leading dims cannot be flattened."""
    return x.reshape(-1, x.shape[-1])


def param_dtypes(x_dtype: Any) -> tuple[Any, ...]:
    """Norm weight/bias: the dtype of x, or fp32 (mixed-precision models keep fp32 weights)."""
    import torch

    return (x_dtype,) if x_dtype in (torch.float32, torch.float64) else (x_dtype, torch.float32)
