"""softmax over the last dim: the declarations of greta::softmax and of its backward's
kernel op greta::softmax_bwd (dx = y * (dy - sum(y * dy, -1))); every binding derives
from them."""

from __future__ import annotations

from typing import Any

from greta_core import reference
from greta_core.ops import _interp_compat, _torch_eager
from greta_core.ops._plan import In, Out, Plan, Wrap, _identity, run
from greta_core.ops._rows import (
    TRITON_DTYPE_NAMES,
    arch_for,
    check_array_rows,
    check_rows_input,
    row_kernel_plan,
    row_stride,
    unflattened,
)
from greta_core.ops._validate import check_same_device, check_same_shape, check_tensor
from greta_core.ops.declare import Backward, Meta, OpDecl, declare

OP = "softmax"
_interp_compat.apply()


def validate(x: Any, reference: bool = False) -> str:
    """Check the inputs; returns the arch to launch on. Raises GretaInputError."""
    check_rows_input(OP, "x", x, reference)
    return arch_for(OP, x, reference)


def validate_bwd(dy: Any, y: Any, reference: bool = False) -> str:
    """Check the inputs; returns the arch to launch on. Raises GretaInputError."""
    check_rows_input(OP, "y", y, reference)
    check_rows_input(OP, "dy", dy, reference)
    check_tensor(OP, "dy", dy, dtypes=(y.dtype,))
    check_same_shape(OP, dy=dy, y=y)
    check_same_device(OP, dy=dy, y=y)
    return arch_for(OP, y, reference)


# --- launch plans: x [..., N] and (dy, y), rows read through one row stride --------------


def plan_fwd(arch: str, x: Meta) -> Plan:
    """Buffers: y (x's shape and dtype)."""
    from greta_core.kernels.softmax import softmax_fwd_kernel  # the plans import no Triton

    args = (In(0), x.shape[-1], row_stride(x.shape, x.strides), Out(0))
    return row_kernel_plan(OP, arch, softmax_fwd_kernel, x, args)


def plan_bwd(arch: str, dy: Meta, y: Meta) -> Plan:
    """Buffers: dx (y's shape and dtype)."""
    from greta_core.kernels.softmax import softmax_bwd_kernel

    strides = (row_stride(dy.shape, dy.strides), row_stride(y.shape, y.strides))
    args = (In(0), In(1), y.shape[-1], *strides, Out(0))
    return row_kernel_plan("softmax_bwd", arch, softmax_bwd_kernel, y, args)


# --- JAX arrays' checks, AOT cases ---------------------------------------------------------


def check_arrays(x: Any) -> None:
    check_array_rows(OP, "x", x)


def _aot(op: str, n_inputs: int) -> Any:
    """One row of every width whose block the table can pick (configs.blocks.aot_widths)."""
    from greta_core.configs.blocks import aot_widths

    def cases(arch: str) -> list[tuple[Meta, ...]]:
        return [
            (Meta.contiguous((1, n), dtype),) * n_inputs
            for dtype in TRITON_DTYPE_NAMES
            for n in aot_widths(op, arch)
        ]

    return cases


# --- the declarations -------------------------------------------------------------------


def _grads(call: Any, grads: tuple[Any, ...], saved: Any) -> tuple[Any, ...]:
    (dy,) = grads
    return (call(SOFTMAX_BWD, call.contiguous(dy), saved.out0),)


SOFTMAX_BWD = declare(OpDecl(
    name="softmax_bwd",
    schema="Tensor dy, Tensor y -> Tensor",
    describe="softmax's backward: y * (dy - sum(y * dy, -1))",
    validate=lambda *args, reference=False: validate_bwd(*args, reference=reference),
    plan=plan_bwd,
    reference=reference.softmax_bwd,
    copies=unflattened,
    front=False,
    aot_cases=_aot("softmax_bwd", 2),
))  # fmt: skip

SOFTMAX = declare(OpDecl(
    name=OP,
    schema="Tensor x -> Tensor",
    describe="softmax over the last dim",
    # A lambda: the module's validate as it is at call time (tests count its calls).
    validate=lambda *args, reference=False: validate(*args, reference=reference),
    plan=plan_fwd,
    reference=reference.softmax,
    backward=Backward(_grads, saves_outputs=(0,)),
    check_arrays=check_arrays,
    copies=unflattened,
    aot_cases=_aot(OP, 1),
    training_route=_torch_eager.softmax,
))  # fmt: skip

# The raw API (greta_core.raw) and the call cache the torch front and tests reach.
_fwd_call = SOFTMAX.call
softmax_if_eager = SOFTMAX.if_eager


def softmax(x: Any, wrap: Wrap = _identity) -> Any:
    """Softmax over the last dim of x ([..., N]), fp32 math, output in x's dtype.

    Raises GretaInputError for a wrong shape, dtype, device or layout.
    """
    return _fwd_call.run(wrap, x)[0]


def softmax_bwd(dy: Any, y: Any, wrap: Wrap = _identity) -> Any:
    """dx = y * (dy - sum(y * dy, -1)) for y = softmax(x).

    Raises GretaInputError for a wrong shape, dtype, device or layout.
    """
    return SOFTMAX_BWD.raw(dy, y, wrap=wrap)


def launch_fwd(x2: Any, y2: Any, arch: str, wrap: Wrap = _identity) -> None:
    """Run the forward into a preallocated y2 [rows, N]."""
    run(SOFTMAX.plan(arch, Meta.of(x2)), (x2,), out=(y2,), wrap=wrap)


def launch_bwd(dy2: Any, y2: Any, dx2: Any, arch: str, wrap: Wrap = _identity) -> None:
    """Run the backward into a preallocated dx2 [rows, N]."""
    run(SOFTMAX_BWD.plan(arch, Meta.of(dy2), Meta.of(y2)), (dy2, y2), out=(dx2,), wrap=wrap)
