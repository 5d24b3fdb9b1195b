from __future__ import annotations

from collections.abc import Callable
from typing import Any

from greta_core import configs
from greta_core.kernels._rows import bwd_programs, row_plan
from greta_core.kernels.col_sum import col_sum_kernel
from greta_core.kernels.col_sum import grid as col_sum_grid
from greta_core.kernels.layer_norm import fwd_grid, layer_norm_bwd_kernel, layer_norm_fwd_kernel
from greta_core.observe import record
from greta_core.ops import _interp_compat
from greta_core.ops._rows import arch_for, check_rows_input, check_vector, param_dtypes, rows_view
from greta_core.ops._validate import (
    GretaInputError,
    check_same_device,
    check_same_shape,
    check_tensor,
)

Wrap = Callable[[Any], Any]
OP = "layer_norm"
_interp_compat.apply()


def _identity(kernel: Any) -> Any:
    return kernel


def _stat_dtypes(reference: bool) -> tuple[Any, ...]:
    import torch

    return (torch.float32, torch.float64) if reference else (torch.float32,)


def _impl(arch: str) -> str:
    return "triton-interpret" if arch == "cpu" else "triton"


def validate(x: Any, weight: Any, bias: Any | None, reference: bool = False) -> str:
    check_rows_input(OP, "x", x, reference)
    check_vector(OP, "weight", weight, x.shape[-1], param_dtypes(x.dtype))
    if bias is not None:
        check_vector(OP, "bias", bias, x.shape[-1], (weight.dtype,))
    check_same_device(OP, x=x, weight=weight, bias=bias)
    return arch_for(OP, x, reference)


def validate_bwd(
    dy: Any, x: Any, weight: Any, mean: Any, rstd: Any, reference: bool = False
) -> str:
    check_rows_input(OP, "x", x, reference)
    check_vector(OP, "weight", weight, x.shape[-1], param_dtypes(x.dtype))
    check_rows_input(OP, "dy", dy, reference)
    check_tensor(OP, "dy", dy, dtypes=(x.dtype,))
    check_same_shape(OP, dy=dy, x=x)
    rows = x.numel() // x.shape[-1]
    for name, t in (("mean", mean), ("rstd", rstd)):
        check_tensor(OP, name, t, dtypes=_stat_dtypes(reference), contiguous=True)
        if t.numel() != rows:
            raise GretaInputError(
                f"{OP}: argument '{name}' has {t.numel()} elements; expected one per row ({rows})"
            )
    check_same_device(OP, dy=dy, x=x, mean=mean, rstd=rstd)
    return arch_for(OP, x, reference)


def launch_fwd(
    x2: Any, weight: Any, bias: Any | None, eps: float, y2: Any, mean: Any, rstd: Any,
    arch: str, wrap: Wrap = _identity,
) -> None:  # fmt: skip
    n_rows, n_cols = x2.shape
    if n_rows == 0:
        return
    plan = row_plan(OP, arch, n_cols)
    has_bias = bias is not None
    wrap(layer_norm_fwd_kernel)[fwd_grid(n_rows)](
        x2, weight, bias if has_bias else weight, n_cols, x2.stride(0), eps, y2, mean, rstd,
        BLOCK_N=plan.block_n, ONE_PASS=plan.one_pass, HAS_BIAS=has_bias, **plan.options,
    )  # fmt: skip
    record(OP, _impl(arch), arch)


def partial_rows(arch: str, n_rows: int, n_cols: int) -> int:
    return bwd_programs(arch, "layer_norm_bwd", n_rows, n_cols)


def launch_bwd(
    dy2: Any, x2: Any, weight: Any, mean: Any, rstd: Any, dx2: Any,
    dw_partial: Any, db_partial: Any, dw: Any, db: Any, arch: str, wrap: Wrap = _identity,
) -> None:  # fmt: skip
    n_rows, n_cols = x2.shape
    plan = row_plan("layer_norm_bwd", arch, n_cols)
    wrap(layer_norm_bwd_kernel)[(dw_partial.shape[0],)](
        dy2, x2, weight, mean, rstd, n_rows, n_cols, dy2.stride(0), x2.stride(0),
        dx2, dw_partial, db_partial,
        BLOCK_N=plan.block_n, ONE_PASS=plan.one_pass, **plan.options,
    )  # fmt: skip
    sum_cfg = configs.lookup("col_sum", arch, {"N": n_cols})
    for partial, out in ((dw_partial, dw), (db_partial, db)):
        wrap(col_sum_kernel)[col_sum_grid(n_cols, sum_cfg["BLOCK_N"])](
            partial, partial.shape[0], n_cols, out,
            BLOCK_P=sum_cfg["BLOCK_P"], BLOCK_N=sum_cfg["BLOCK_N"],
            **configs.launch_options(sum_cfg, arch),
        )  # fmt: skip
    record("layer_norm_bwd", _impl(arch), arch)


def layer_norm_fwd(
    x: Any, weight: Any, bias: Any | None = None, eps: float = 1e-5
) -> tuple[Any, Any, Any]:
    """(y, mean, rstd): y = (x - mean) * rstd * weight + bias; mean/rstd fp32 [rows]."""
    import torch

    arch = validate(x, weight, bias)
    x2 = rows_view(x)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    mean = torch.empty(x2.shape[0], dtype=torch.float32, device=x.device)
    rstd = torch.empty_like(mean)
    launch_fwd(x2, weight, bias, float(eps), y.view(x2.shape), mean, rstd, arch)
    return y, mean, rstd


def layer_norm(x: Any, weight: Any, bias: Any | None = None, eps: float = 1e-5) -> Any:
    """LayerNorm over the last dim of x ([..., N]); weight/bias [N]. No autograd."""
    return layer_norm_fwd(x, weight, bias, eps)[0]


def layer_norm_bwd(dy: Any, x: Any, weight: Any, mean: Any, rstd: Any) -> tuple[Any, Any, Any]:
    """(dx, dweight, dbias); deterministic (fixed-order partial sums). dbias in weight dtype."""
    import torch

    arch = validate_bwd(dy, x, weight, mean, rstd)
    x2 = rows_view(x)
    n_rows, n_cols = x2.shape
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    dw = torch.empty_like(weight)
    db = torch.empty_like(weight)
    if n_rows == 0:
        return dx, dw.zero_(), db.zero_()
    programs = partial_rows(arch, n_rows, n_cols)
    dw_partial = torch.empty((programs, n_cols), dtype=torch.float32, device=x.device)
    db_partial = torch.empty_like(dw_partial)
    launch_bwd(
        rows_view(dy), x2, weight, mean, rstd, dx.view(x2.shape), dw_partial, db_partial,
        dw, db, arch,
    )  # fmt: skip
    return dx, dw, db
