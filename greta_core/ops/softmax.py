from __future__ import annotations

from collections.abc import Callable
from typing import Any

from greta_core.kernels._rows import row_plan
from greta_core.kernels.softmax import grid, softmax_bwd_kernel, softmax_fwd_kernel
from greta_core.observe import record
from greta_core.ops import _interp_compat
from greta_core.ops._rows import arch_for, check_rows_input, rows_view
from greta_core.ops._validate import check_same_device, check_same_shape, check_tensor

Wrap = Callable[[Any], Any]
OP = "softmax"
_interp_compat.apply()


def _identity(kernel: Any) -> Any:
    return kernel


def _impl(arch: str) -> str:
    return "triton-interpret" if arch == "cpu" else "triton"


def validate(x: Any, reference: bool = False) -> str:
    check_rows_input(OP, "x", x, reference)
    return arch_for(OP, x, reference)


def validate_bwd(dy: Any, y: Any, reference: bool = False) -> str:
    check_rows_input(OP, "y", y, reference)
    check_rows_input(OP, "dy", dy, reference)
    check_tensor(OP, "dy", dy, dtypes=(y.dtype,))
    check_same_shape(OP, dy=dy, y=y)
    check_same_device(OP, dy=dy, y=y)
    return arch_for(OP, y, reference)


def launch_fwd(x2: Any, y2: Any, arch: str, wrap: Wrap = _identity) -> None:
    n_rows, n_cols = x2.shape
    if n_rows == 0:
        return
    plan = row_plan(OP, arch, n_cols)
    wrap(softmax_fwd_kernel)[grid(n_rows)](
        x2, n_cols, x2.stride(0), y2,
        BLOCK_N=plan.block_n, ONE_PASS=plan.one_pass, **plan.options,
    )  # fmt: skip
    record(OP, _impl(arch), arch)


def launch_bwd(dy2: Any, y2: Any, dx2: Any, arch: str, wrap: Wrap = _identity) -> None:
    n_rows, n_cols = y2.shape
    if n_rows == 0:
        return
    plan = row_plan("softmax_bwd", arch, n_cols)
    wrap(softmax_bwd_kernel)[grid(n_rows)](
        dy2, y2, n_cols, dy2.stride(0), y2.stride(0), dx2,
        BLOCK_N=plan.block_n, ONE_PASS=plan.one_pass, **plan.options,
    )  # fmt: skip
    record("softmax_bwd", _impl(arch), arch)


def softmax(x: Any) -> Any:
    """Softmax over the last dim of x ([..., N]), fp32 math, output in x's dtype."""
    import torch

    arch = validate(x)
    x2 = rows_view(x)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    launch_fwd(x2, y.view(x2.shape), arch)
    return y


def softmax_bwd(dy: Any, y: Any) -> Any:
    """dx = y * (dy - sum(y * dy, -1)) for y = softmax(x)."""
    import torch

    arch = validate_bwd(dy, y)
    y2 = rows_view(y)
    dx = torch.empty(y.shape, dtype=y.dtype, device=y.device)
    launch_bwd(rows_view(dy), y2, dx.view(y2.shape), arch)
    return dx
