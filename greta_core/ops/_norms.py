"""What the norms (rms_norm, layer_norm, add_rms_norm) declare alike: a forward that saves
per-row statistics and a backward kernel op that reads them, the backward's input checks,
and the AOT cases, read off the schemas."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

from greta_core import reference
from greta_core.ops._plan import Plan
from greta_core.ops._rows import (
    BWD_AOT_ROWS,
    aot_norm_grid,
    arch_for,
    check_array_param,
    check_array_rows,
    check_rows_input,
    check_vector,
    norm_bwd_plan,
    param_dtypes,
    rows_stride,
    stat_dtypes,
    unflattened,
)
from greta_core.ops._validate import (
    GretaInputError,
    check_same_device,
    check_same_shape,
    check_tensor,
)
from greta_core.ops.declare import Arg, Backward, Meta, OpDecl, declare, parse_schema


def check_stats(op: str, x: Any, reference: bool, **stats: Any) -> None:
    """A norm's saved statistics: fp32 (float64 on the reference path), one per row."""
    rows = x.numel() // x.shape[-1]
    for name, t in stats.items():
        check_tensor(op, name, t, dtypes=stat_dtypes(reference), contiguous=True)
        if t.numel() != rows:
            raise GretaInputError(
                f"{op}: argument '{name}' has {t.numel()} elements; expected one per row ({rows})"
            )


def validate_fwd(op: str, x: Any, weight: Any, bias: Any | None, reference: bool) -> str:
    """The checks of a norm's x [..., N], weight [N] (x's dtype or fp32) and optional bias
    [N] (weight's dtype); returns the arch."""
    check_rows_input(op, "x", x, reference)
    check_vector(op, "weight", weight, x.shape[-1], param_dtypes(x.dtype))
    if bias is not None:
        check_vector(op, "bias", bias, x.shape[-1], (weight.dtype,))
    check_same_device(op, x=x, weight=weight, bias=bias)
    return arch_for(op, x, reference)


def check_arrays(op: str, x: Any, weight: Any, bias: Any | None = None) -> None:
    """JAX arrays' :func:`validate_fwd`."""
    check_array_rows(op, "x", x)
    check_array_param(op, "weight", weight, x)
    if bias is not None:
        check_array_param(op, "bias", bias, x)


def validate_bwd(
    op: str, dy: Any, x: Any, weight: Any, reference: bool = False, **stats: Any
) -> str:
    """The checks of a norm backward's (dy, x, weight, statistics); returns the arch."""
    check_rows_input(op, "x", x, reference)
    check_vector(op, "weight", weight, x.shape[-1], param_dtypes(x.dtype))
    check_rows_input(op, "dy", dy, reference)
    check_tensor(op, "dy", dy, dtypes=(x.dtype,))
    check_same_shape(op, dy=dy, x=x)
    check_stats(op, x, reference, **stats)
    check_same_device(op, dy=dy, x=x, **stats)
    return arch_for(op, x, reference)


def plan_bwd(op: str, n_params: int) -> Callable[..., Plan]:
    """The plan of ``greta_core.kernels.<op>.<op>_bwd_kernel`` over (dy, x, weight,
    statistics...): dx, fp32 partials, the `n_params` parameter gradients (weight dtype);
    deterministic (fixed-order partial sums, ``norm_bwd_plan``)."""

    def plan(arch: str, dy: Meta, x: Meta, weight: Meta, *stats: Meta) -> Plan:
        # The declarations import no Triton: the kernel module is imported when planning.
        kernel = getattr(importlib.import_module(f"greta_core.kernels.{op}"), f"{op}_bwd_kernel")
        return norm_bwd_plan(
            f"{op}_bwd", kernel, 3 + len(stats), n_params, x.shape,
            (rows_stride(dy), rows_stride(x)), x.dtype, weight.dtype, arch,
        )  # fmt: skip

    return plan


def _late(module: str, name: str) -> Callable[..., str]:
    # The module's function as it is at call time (tests swap it to count its calls).
    return lambda *args, reference=False: getattr(sys.modules[module], name)(
        *args, reference=reference
    )


def _rows_of(args: tuple[Arg, ...]) -> int:
    """The [..., N] row tensors come first, up to 'weight'."""
    return [a.name for a in args].index("weight")


def _case(args: tuple[Arg, ...], x: Any, w: Any, stat: Any, bias: bool) -> tuple[Any, ...]:
    """One AOT case of a norm's schema: rows x, weight w, an optional parameter w (None
    without `bias`), statistics `stat`, scalars at their defaults."""
    rows = _rows_of(args)
    case = []
    for i, a in enumerate(args):
        if not a.is_tensor:
            case.append(a.default)
        elif i <= rows:
            case.append(x if i < rows else w)
        elif a.type == "Tensor?":
            case.append(w if bias else None)
        else:
            case.append(stat)
    return tuple(case)


def declare_norm(
    module: str, schema: str, describe: str, backward: Backward, stats: tuple[str, ...],
    bwd: tuple[str, str], training_route: Callable[..., Any] | None = None,
) -> tuple[OpDecl, OpDecl]:  # fmt: skip
    """(greta::<op>, greta::<op>_bwd) of the norm module `module` (``__name__``), from its
    ``OP``, ``validate``, ``validate_bwd``, ``plan_fwd``, ``plan_bwd`` and ``check_arrays``
    and ``reference.<op>_fwd`` / ``<op>_bwd``. `bwd`: the backward's (schema, describe);
    `training_route`: ``OpDecl.training_route``."""
    ns = sys.modules[module]
    op = ns.OP
    fwd_args, bwd_args = parse_schema(schema)[0], parse_schema(bwd[0])[0]
    rows, bwd_rows = _rows_of(fwd_args), _rows_of(bwd_args)
    optional = any(a.type == "Tensor?" for a in fwd_args)
    norm_bwd = declare(OpDecl(
        name=f"{op}_bwd", schema=bwd[0], describe=bwd[1], front=False,
        validate=_late(module, "validate_bwd"), plan=ns.plan_bwd,
        reference=getattr(reference, f"{op}_bwd"),
        copies=lambda *metas: unflattened(*metas[:bwd_rows]),
        aot_cases=lambda arch: [
            _case(bwd_args, x, w, stat, True)
            for x, w, stat in aot_norm_grid(f"{op}_bwd", arch, BWD_AOT_ROWS)
        ],
    ))  # fmt: skip
    norm = declare(OpDecl(
        name=op, schema=schema, describe=describe, backward=backward, stats=stats,
        validate=_late(module, "validate"), plan=ns.plan_fwd,
        reference=getattr(reference, f"{op}_fwd"), check_arrays=ns.check_arrays,
        copies=lambda *metas: unflattened(*metas[:rows]), fwd_defaults=False,
        training_route=training_route,
        aot_cases=lambda arch: [
            (*_case(fwd_args, x, w, stat, bias), with_stats)
            for x, w, stat in aot_norm_grid(op, arch)
            for with_stats in (True, False)
            for bias in ((True, False) if optional else (True,))
        ],
    ))  # fmt: skip
    return norm, norm_bwd
