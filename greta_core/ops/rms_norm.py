from __future__ import annotations

from collections.abc import Callable
from typing import Any

from greta_core.kernels._rows import bwd_programs, row_plan
from greta_core.kernels.col_sum import col_sum_kernel
from greta_core.kernels.col_sum import grid as col_sum_grid
from greta_core.kernels.rms_norm import fwd_grid, rms_norm_bwd_kernel, rms_norm_fwd_kernel
from greta_core.observe import record
from greta_core.ops import _interp_compat
from greta_core.ops._rows import (
    arch_for,
    check_rows_input,
    check_vector,
    param_dtypes,
    rows_view,
)
from greta_core.ops._validate import (
    GretaInputError,
    check_same_device,
    check_same_shape,
    check_tensor,
)

Wrap = Callable[[Any], Any]
OP = "rms_norm"
_interp_compat.apply()


def _identity(kernel: Any) -> Any:
    return kernel


def _stat_dtypes(reference: bool) -> tuple[Any, ...]:
    import torch

    return (torch.float32, torch.float64) if reference else (torch.float32,)


def _impl(arch: str) -> str:
    return "triton-interpret" if arch == "cpu" else "triton"


def validate(x: Any, weight: Any, reference: bool = False) -> str:
    check_rows_input(OP, "x", x, reference)
    check_vector(OP, "weight", weight, x.shape[-1], param_dtypes(x.dtype))
    check_same_device(OP, x=x, weight=weight)
    return arch_for(OP, x, reference)


def validate_bwd(dy: Any, x: Any, weight: Any, rstd: Any, reference: bool = False) -> str:
    check_rows_input(OP, "x", x, reference)
    check_vector(OP, "weight", weight, x.shape[-1], param_dtypes(x.dtype))
    check_rows_input(OP, "dy", dy, reference)
    check_tensor(OP, "dy", dy, dtypes=(x.dtype,))
    check_same_shape(OP, dy=dy, x=x)
    check_tensor(OP, "rstd", rstd, dtypes=_stat_dtypes(reference), contiguous=True)
    if rstd.numel() != x.numel() // x.shape[-1]:
        raise GretaInputError(
            f"{OP}: argument 'rstd' has {rstd.numel()} elements; expected one per row "
            f"({x.numel() // x.shape[-1]})"
        )
    check_same_device(OP, dy=dy, x=x, rstd=rstd)
    return arch_for(OP, x, reference)


def launch_fwd(
    x2: Any, weight: Any, eps: float, y2: Any, rstd: Any, arch: str, wrap: Wrap = _identity
) -> None:
    n_rows, n_cols = x2.shape
    if n_rows == 0:
        return
    plan = row_plan(OP, arch, n_cols)
    wrap(rms_norm_fwd_kernel)[fwd_grid(n_rows)](
        x2, weight, n_cols, x2.stride(0), eps, y2, rstd,
        BLOCK_N=plan.block_n, ONE_PASS=plan.one_pass, **plan.options,
    )  # fmt: skip
    record(OP, _impl(arch), arch)


def launch_bwd(
    dy2: Any, x2: Any, weight: Any, rstd: Any, dx2: Any, dw_partial: Any, dw: Any,
    arch: str, wrap: Wrap = _identity,
) -> None:  # fmt: skip
    """dw_partial: fp32 [programs(arch, rows, N), N] scratch (see ``partial_rows``)."""
    from greta_core import configs

    n_rows, n_cols = x2.shape
    plan = row_plan("rms_norm_bwd", arch, n_cols)
    wrap(rms_norm_bwd_kernel)[(dw_partial.shape[0],)](
        dy2, x2, weight, rstd, n_rows, n_cols, dy2.stride(0), x2.stride(0), dx2, dw_partial,
        BLOCK_N=plan.block_n, ONE_PASS=plan.one_pass, **plan.options,
    )  # fmt: skip
    sum_cfg = configs.lookup("col_sum", arch, {"N": n_cols})
    wrap(col_sum_kernel)[col_sum_grid(n_cols, sum_cfg["BLOCK_N"])](
        dw_partial, dw_partial.shape[0], n_cols, dw,
        BLOCK_P=sum_cfg["BLOCK_P"], BLOCK_N=sum_cfg["BLOCK_N"],
        **configs.launch_options(sum_cfg, arch),
    )  # fmt: skip
    record("rms_norm_bwd", _impl(arch), arch)


def partial_rows(arch: str, n_rows: int, n_cols: int) -> int:
    return bwd_programs(arch, "rms_norm_bwd", n_rows, n_cols)


def rms_norm_fwd(x: Any, weight: Any, eps: float = 1e-6) -> tuple[Any, Any]:
    """(y, rstd): y = x * rstd * weight over the last dim; rstd fp32 [rows]."""
    import torch

    arch = validate(x, weight)
    x2 = rows_view(x)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rstd = torch.empty(x2.shape[0], dtype=torch.float32, device=x.device)
    launch_fwd(x2, weight, float(eps), y.view(x2.shape), rstd, arch)
    return y, rstd


def rms_norm(x: Any, weight: Any, eps: float = 1e-6) -> Any:
    """RMSNorm over the last dim of x ([..., N]); weight [N]. No autograd (see torch.ops)."""
    return rms_norm_fwd(x, weight, eps)[0]


def rms_norm_bwd(dy: Any, x: Any, weight: Any, rstd: Any) -> tuple[Any, Any]:
    """(dx, dweight) for dy = dL/dy; deterministic (fixed-order partial sums)."""
    import torch

    arch = validate_bwd(dy, x, weight, rstd)
    x2 = rows_view(x)
    n_rows, n_cols = x2.shape
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    dw = torch.empty_like(weight)
    if n_rows == 0:
        return dx, dw.zero_()
    partial = torch.empty(
        (partial_rows(arch, n_rows, n_cols), n_cols), dtype=torch.float32, device=x.device
    )
    launch_bwd(rows_view(dy), x2, weight, rstd, dx.view(x2.shape), partial, dw, arch)
    return dx, dw
