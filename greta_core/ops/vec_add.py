"""vec_add: validation and the launch plan that the raw API, torch.ops.greta and JAX run."""

from __future__ import annotations

from typing import Any

from greta_core import configs
from greta_core.kernels.vec_add import vec_add_kernel
from greta_core.ops._calls import ForwardCall, tensors_as_given
from greta_core.ops._plan import Buffer, In, Launch, Out, Plan, Wrap, dtype_name, memo, run
from greta_core.ops._plan import _identity as _no_wrap
from greta_core.ops._validate import (
    check_same_device,
    check_same_shape,
    check_tensor,
    launch_arch,
)

OP = "vec_add"


def check_inputs(x: Any, y: Any) -> None:
    """The rules every path shares (the torch reference included)."""
    check_tensor(OP, "x", x)
    check_tensor(OP, "y", y, dtypes=(x.dtype,))
    check_same_shape(OP, x=x, y=y)


def validate(x: Any, y: Any) -> str:
    """Check the inputs and return the arch to launch on. Raises GretaInputError."""
    check_inputs(x, y)
    check_tensor(OP, "x", x, contiguous=True)
    check_tensor(OP, "y", y, contiguous=True)
    check_same_device(OP, x=x, y=y)
    return launch_arch(OP, x)


@memo
def plan(shape: tuple[int, ...], dtype: str, arch: str) -> Plan:
    """Inputs (x, y) contiguous; buffer: out (x's shape and dtype)."""
    n = 1
    for d in shape:
        n *= d
    config = configs.lookup(OP, arch, {"n": n})
    block = config["BLOCK"]
    launch = Launch(
        vec_add_kernel, ((n + block - 1) // block,), (In(0), In(1), n, Out(0)),
        {"BLOCK": block}, configs.launch_options(config, arch),
    )  # fmt: skip
    return Plan(OP, arch, (Buffer(shape, dtype),), (launch,) if n else (), (0,))


def launch(x: Any, y: Any, out: Any, arch: str, wrap: Wrap = _no_wrap) -> None:
    """Launch into a preallocated `out`; `wrap` is `torch.library.wrap_triton` in a triton_op."""
    run(plan(tuple(x.shape), dtype_name(x.dtype), arch), (x, y), out=(out,), wrap=wrap)


def _resolve(x: Any, y: Any) -> Plan:
    arch = validate(x, y)
    return plan(tuple(x.shape), dtype_name(x.dtype), arch)


# Validation and planning once per call signature (see ops/_calls.py); the plan takes x
# and y as given (validation rejects other strides): every signature may launch ready.
_call = ForwardCall(_resolve, 2, *tensors_as_given(2))


def vec_add(x: Any, y: Any, out: Any | None = None, wrap: Wrap = _no_wrap) -> Any:
    """out = x + y for contiguous tensors of one shape, dtype and device.

    Raises GretaInputError for a wrong shape, dtype, device or layout.
    """
    if out is None:
        return _call.run(wrap, x, y)[0]
    p = _call(x, y)
    check_tensor(OP, "out", out, dtypes=(x.dtype,), contiguous=True)
    check_same_shape(OP, x=x, out=out)
    run(p, (x, y), out=(out,), wrap=wrap)
    return out


def vec_add_if_eager(x: Any, y: Any) -> Any | None:
    """:func:`vec_add` for a call :func:`~greta_core.ops._calls.eager_raw` allows (the
    torch.ops front's hot path), else None: the caller then takes its torch op."""
    done = _call.if_eager(x, y)
    return None if done is None else done[0]
