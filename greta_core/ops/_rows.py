"""Validation, reshaping and launch planning shared by the row-wise ops (norms, softmax)."""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from typing import Any

from greta_core import configs
from greta_core.arch import is_hip
from greta_core.configs.blocks import row_block
from greta_core.ops._plan import Buffer, In, Launch, Out, Plan
from greta_core.ops._validate import GretaInputError, check_tensor, launch_arch

TRITON_DTYPE_NAMES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class RowPlan:
    block_n: int
    one_pass: bool
    options: dict[str, Any]  # num_warps / num_stages (+ HIP knobs on AMD)
    config: dict[str, Any]


def row_plan(op: str, arch: str, n_cols: int) -> RowPlan:
    """Block, pass count and options for rows of `n_cols`: memoized.

    Keyed on `configs.lookup` itself, so `greta tune` swapping it never sees a stale
    plan; a symbolic width (torch.compile tracing) is planned without the memo.
    """
    if type(n_cols) is not int:
        return _plan(op, arch, n_cols, configs.lookup)
    return _memo_plan(op, arch, n_cols, configs.lookup)


def _plan(op: str, arch: str, n_cols: int, lookup: Any) -> RowPlan:
    config = lookup(op, arch, {"N": n_cols})
    block, one_pass = row_block(config, n_cols)
    return RowPlan(block, one_pass, configs.launch_options(config, arch), config)


_memo_plan = functools.lru_cache(maxsize=1024)(_plan)


def bwd_programs(arch: str, op: str, n_rows: int, n_cols: int) -> int:
    """Programs of a backward that writes per-program weight-grad partials (deterministic)."""
    config = configs.lookup(op, arch, {"N": n_cols})
    return max(1, min(n_rows, int(config["PROGRAMS"])))


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


def row_stride(shape: tuple[int, ...], strides: tuple[int, ...]) -> int | None:
    """The row stride of x seen as [rows, N] without a copy; None when flattening the
    leading dims needs one (then ``rows_view`` copies into a contiguous [rows, N])."""
    lead = [(n, st) for n, st in zip(shape[:-1], strides[:-1], strict=True) if n != 1]
    if not lead or any(n == 0 for n, _ in lead):
        return shape[-1]
    for (_, outer), (n, inner) in itertools.pairwise(lead):
        if outer != inner * n:
            return None
    return lead[-1][1]


def row_layout(x: Any) -> tuple[tuple[int, ...], int, bool]:
    """(shape, row stride, whether ``rows_view`` copies) of a [..., N] tensor."""
    shape = tuple(x.shape)
    stride = row_stride(shape, tuple(x.stride()))
    return shape, shape[-1] if stride is None else stride, stride is None


def rows_view(x: Any) -> Any:
    """[..., N] -> [rows, N]; a copy only when the leading dims cannot be flattened."""
    return x.reshape(-1, x.shape[-1])


def stat_dtypes(reference: bool) -> tuple[Any, ...]:
    """The norms' saved mean/rstd: fp32 (float64 too on the reference path, for gradcheck)."""
    import torch

    return (torch.float32, torch.float64) if reference else (torch.float32,)


def param_dtypes(x_dtype: Any) -> tuple[Any, ...]:
    """Norm weight/bias: the dtype of x, or fp32 (mixed-precision models keep fp32 weights)."""
    import torch

    return (x_dtype,) if x_dtype in (torch.float32, torch.float64) else (x_dtype, torch.float32)


def col_sum_launch(
    arch: str, partial: Any, n_partials: int, n_cols: int, out: Any, out2: Any = None
) -> Launch:
    """Add [n_partials, n_cols] fp32 partials into `out` [n_cols] (the norms' dweight/dbias);
    with `out2`, the next [n_partials, n_cols] of `partial` into `out2` in the same launch."""
    from greta_core.kernels.col_sum import col_sum_kernel  # the planners import no Triton

    config = configs.lookup("col_sum", arch, {"N": n_cols})
    block_n = config["BLOCK_N"]
    return Launch(
        col_sum_kernel,
        ((n_cols + block_n - 1) // block_n, 1 if out2 is None else 2),
        (partial, n_partials, n_cols, out, out if out2 is None else out2),
        {"BLOCK_P": config["BLOCK_P"], "BLOCK_N": block_n},
        configs.launch_options(config, arch),
    )


def store_wait(arch: str) -> int:
    """WAIT_STORES of a norm backward in one launch: how an AMD wave waits for its own
    stores before the barrier (Triton's barrier there does not; ``kernels/_rows.py``):
    1 gfx9 (vmcnt), 2 gfx10/gfx11 (vscnt), 3 gfx12 (storecnt); 0 elsewhere (NVIDIA's
    bar.sync orders them, the interpreter runs programs one after another)."""
    if not is_hip(arch):
        return 0
    return 3 if arch.startswith("gfx12") else 2 if arch.startswith(("gfx10", "gfx11")) else 1


def reduce_last_programs(
    op: str, arch: str, n_rows: int, n_cols: int, n_params: int, bound: int
) -> int:
    """Programs of a norm backward in one launch (its last program adds the partials), or 0
    for the two-launch form (kernel + ``col_sum``).

    ceil(sqrt(rows)) programs (at most ``bwd_programs``'): a program's serial work is its
    rows (rows / P of them) plus, for the last one, the P partial rows it adds, least near
    P = sqrt(rows) (256 rows: 16 programs of 16 rows). One launch when those partials are
    small: P * N * `n_params` <= `bound`, ``norm_bwd_reduce``'s MAX_PARTIALS (0: never)."""
    if bound <= 0 or n_rows <= 0:
        return 0
    programs = min(bwd_programs(arch, op, n_rows, n_cols), math.isqrt(n_rows - 1) + 1)
    return programs if programs * n_cols * n_params <= bound else 0


def norm_bwd_plan(
    op: str, kernel: Any, n_inputs: int, n_params: int, shape: tuple[int, ...],
    strides: tuple[int, int], dtype: str, w_dtype: str, arch: str, weight: int = 2,
) -> Plan:  # fmt: skip
    """The backward of a norm with `n_params` (1 or 2) per-column parameters (weight[, bias]).

    Inputs In(0..n_inputs-1) (dy, x, weight, saved stats... for `op`'s kernel), then the
    kernel's scalars (rows, N, the two row `strides`). One launch of `kernel` (a program per
    ``bwd_programs``) writes dx and one fp32 partials row per program for each parameter,
    into one buffer ([n_params * programs, N]: the bias's rows after the weight's); one
    column-sum launch adds them per parameter (deterministic). Buffers: dx, the partials
    (scratch), the parameter gradients (weight dtype, zeros when there are no rows). One
    buffer and one launch for both parameters: the host time of a training step's small
    norms is mostly per launch and per allocation (issue 25).

    Where ``reduce_last_programs`` allows it, one launch: the kernel's REDUCE_LAST form (on
    AMD with ``store_wait``'s WAIT_STORES: each wave waits for its stores before the
    barrier, ``kernels/_rows.py``),
    whose last program adds the partials in ``col_sum``'s order and writes the gradients;
    it counts finished programs in one more scratch buffer, an int32 that is zero when the
    kernel starts and that the kernel leaves zero (``Buffer(zeroed=True)``: the ready
    launch takes it from the scratch arena's zeroed header, see ``ops/_calls.py``). The
    kernel's gradient and counter pointers come before dx; the two-launch form passes it
    inputs there (unread: In(`weight`) for the gradients, the last input, a statistic, for
    the counter), so its written buffers stay (dx, partials): JAX's outputs are a launch's
    trailing buffers.
    """
    n_rows, n_cols = math.prod(shape[:-1]), shape[-1]
    rp = row_plan(op, arch, n_cols)
    reduce = configs.lookup("norm_bwd_reduce", arch, {"N": n_cols})
    one = reduce_last_programs(op, arch, n_rows, n_cols, n_params, int(reduce["MAX_PARTIALS"]))
    programs = one or bwd_programs(arch, op, n_rows, n_cols)
    inputs = tuple(In(i) for i in range(n_inputs))
    scalars = (n_rows, n_cols, *strides)
    grads = tuple(Out(2 + i) for i in range(n_params))
    buffers = (
        Buffer(shape, dtype),
        Buffer((n_params * programs, n_cols), "float32"),
        *(Buffer((n_cols,), w_dtype, zeroed=n_rows == 0) for _ in grads),
    )
    if one:
        bwd = Launch(
            kernel, (programs,), (*inputs, *scalars, *grads, Out(2 + n_params), Out(0), Out(1)),
            {"BLOCK_N": rp.block_n, "ONE_PASS": rp.one_pass, "REDUCE_LAST": True,
             "BLOCK_R": reduce["BLOCK_R"], "BLOCK_P": reduce["BLOCK_P"],
             "WAIT_STORES": store_wait(arch)},
            rp.options,
        )  # fmt: skip
        buffers += (Buffer((1,), "int32", zeroed=True),)
        return Plan(op, arch, buffers, (bwd,), (0, *(g.index for g in grads)))
    unread = (In(weight),) * n_params + (In(n_inputs - 1),)
    bwd = Launch(
        kernel, (programs,), (*inputs, *scalars, *unread, Out(0), Out(1)),
        {"BLOCK_N": rp.block_n, "ONE_PASS": rp.one_pass, "REDUCE_LAST": False, "BLOCK_R": 1,
         "BLOCK_P": 1, "WAIT_STORES": 0},
        rp.options,
    )  # fmt: skip
    col_sum = col_sum_launch(arch, Out(1), programs, n_cols, *grads)
    return Plan(op, arch, buffers, (bwd, col_sum) if n_rows else (), (0, *(g.index for g in grads)))


# --- what the declared row ops share (greta_core.ops.declare) ------------------------------


def unflattened(*metas: Any) -> tuple[int, ...]:
    """Positions among `metas` (:class:`~greta_core.ops.declare.Meta`) of the [..., N]
    tensors that cannot be seen as [rows, N] without a copy: a declaration's ``copies``."""
    return tuple(i for i, m in enumerate(metas) if row_stride(m.shape, m.strides) is None)


def rows_stride(m: Any) -> int:
    """The row stride of a [..., N] Meta that flattens (``unflattened`` copied the others)."""
    stride = row_stride(m.shape, m.strides)
    return m.shape[-1] if stride is None else stride


def row_kernel_plan(
    op: str, arch: str, kernel: Any, x: Any, args: tuple[Any, ...],
    flags: dict[str, Any] | None = None, outputs: int = 1, stats: int = 0,
) -> Plan:  # fmt: skip
    """One program per row of `x` (a [..., N] Meta) launching `kernel` with `args`, the row
    plan's BLOCK_N and ONE_PASS, then `flags`. Buffers: `outputs` of x's shape and dtype,
    then `stats` fp32 [rows] (a norm forward's saved statistics; none when no backward
    follows, and the plan then turns their stores off)."""
    n_rows, n_cols = math.prod(x.shape[:-1]), x.shape[-1]
    rp = row_plan(op, arch, n_cols)
    constexprs = {"BLOCK_N": rp.block_n, "ONE_PASS": rp.one_pass, **(flags or {})}
    launch = Launch(kernel, (n_rows,), args, constexprs, rp.options)
    buffers = (Buffer(x.shape, x.dtype),) * outputs + (Buffer((n_rows,), "float32"),) * stats
    return Plan(op, arch, buffers, (launch,) if n_rows else (), tuple(range(len(buffers))))


# --- JAX arrays' checks of the row ops (torch tensors: the validate functions) -------------


def check_array_float(op: str, name: str, a: Any, reference_ok: bool = True) -> None:
    allowed = (*TRITON_DTYPE_NAMES, "float64") if reference_ok else TRITON_DTYPE_NAMES
    if not hasattr(a, "shape") or not hasattr(a, "dtype"):
        raise GretaInputError(f"{op}: argument '{name}' must be an array, got {type(a).__name__}")
    if str(a.dtype) not in allowed:
        raise GretaInputError(
            f"{op}: argument '{name}' has dtype {a.dtype}; expected one of: {', '.join(allowed)}"
        )


def check_array_rows(op: str, name: str, x: Any) -> None:
    check_array_float(op, name, x)
    if x.ndim < 1 or x.shape[-1] == 0:
        raise GretaInputError(f"{op}: argument '{name}' needs a non-empty last dim, got {x.shape}")


def check_array_param(op: str, name: str, w: Any, x: Any) -> None:
    check_array_float(op, name, w)
    if w.shape != (x.shape[-1],):
        raise GretaInputError(
            f"{op}: argument '{name}' has shape {w.shape}; expected ({x.shape[-1]},)"
        )
    if str(w.dtype) not in (str(x.dtype), "float32"):
        raise GretaInputError(
            f"{op}: argument '{name}' has dtype {w.dtype}; expected {x.dtype} or float32"
        )


def check_arrays_alike(op: str, a_name: str, a: Any, b_name: str, b: Any) -> None:
    """Two arrays an op reads element by element: one shape and one dtype."""
    if a.shape != b.shape or a.dtype != b.dtype:
        raise GretaInputError(
            f"{op}: arguments '{a_name}' {a.shape} {a.dtype} and '{b_name}' {b.shape} {b.dtype} "
            "must have one shape and dtype"
        )


# The row counts of a norm backward's AOT cases beside 4. 4 rows (2 programs) take the
# one-launch form wherever a width can for more than one row (a 1-row call's n_rows == 1
# is a constexpr to Triton: compiled on first use, as any), 2**20 rows the two-launch form
# wherever a width can (as many programs as the table allows): the variants calls reach
# under the table's ``norm_bwd_reduce`` bound; with it 0, the same as 4 rows alone.
BWD_AOT_ROWS = (2**20,)


def aot_norm_grid(op: str, arch: str, rows: tuple[int, ...] = ()) -> list[tuple[Any, Any, Any]]:
    """(x [rows, N], weight [N], a statistic fp32 [rows]) Metas for a norm's AOT cases:
    every width whose plan picks a block the table can pick (``aot_widths``), every kernel
    dtype, weights in x's dtype or fp32; 4 rows, then each of `rows`."""
    from greta_core.configs.blocks import aot_widths
    from greta_core.ops.declare import Meta

    return [
        (Meta.contiguous((r, n), dtype), Meta.contiguous((n,), wdtype),
         Meta.contiguous((r,), "float32"))
        for n in aot_widths(op, arch)
        for dtype in TRITON_DTYPE_NAMES
        for wdtype in sorted({dtype, "float32"})
        for r in (4, *rows)
    ]  # fmt: skip
