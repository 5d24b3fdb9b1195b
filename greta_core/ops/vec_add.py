"""vec_add (x + y): the declaration of greta::vec_add; every binding derives from it."""

from __future__ import annotations

import math
from typing import Any

from greta_core import configs, reference
from greta_core.ops._plan import Buffer, In, Launch, Out, Plan, Wrap, _identity, run
from greta_core.ops._rows import TRITON_DTYPE_NAMES, arch_for, check_arrays_alike
from greta_core.ops._validate import check_same_device, check_same_shape, check_tensor
from greta_core.ops.declare import Backward, Meta, OpDecl, declare

OP = "vec_add"


def check_inputs(x: Any, y: Any) -> None:
    """The rules every path shares (the torch reference included)."""
    check_tensor(OP, "x", x)
    check_tensor(OP, "y", y, dtypes=(x.dtype,))
    check_same_shape(OP, x=x, y=y)


def validate(x: Any, y: Any, reference: bool = False) -> str:
    """Check the inputs and return the arch to launch on. Raises GretaInputError."""
    check_inputs(x, y)
    if reference:
        return "reference"
    check_tensor(OP, "x", x, contiguous=True)
    check_tensor(OP, "y", y, contiguous=True)
    check_same_device(OP, x=x, y=y)
    return arch_for(OP, x, reference)


def plan(arch: str, x: Meta, y: Meta) -> Plan:
    """Inputs (x, y) contiguous; buffer: out (x's shape and dtype)."""
    from greta_core.kernels.vec_add import vec_add_kernel  # the declaration imports no Triton

    n = math.prod(x.shape)
    config = configs.lookup(OP, arch, {"n": n})
    block = config["BLOCK"]
    launch = Launch(
        vec_add_kernel, ((n + block - 1) // block,), (In(0), In(1), n, Out(0)),
        {"BLOCK": block}, configs.launch_options(config, arch),
    )  # fmt: skip
    return Plan(OP, arch, (Buffer(x.shape, x.dtype),), (launch,) if n else (), (0,))


def check_arrays(x: Any, y: Any) -> None:
    check_arrays_alike(OP, "x", x, "y", y)


def _grads(call: Any, grads: tuple[Any, ...], saved: Any) -> tuple[Any, ...]:
    (dy,) = grads
    return dy, dy


VEC_ADD = declare(OpDecl(
    name=OP,
    schema="Tensor x, Tensor y -> Tensor",
    describe="element-wise x + y",
    # A lambda: the module's validate as it is at call time (tests count its calls).
    validate=lambda *args, reference=False: validate(*args, reference=reference),
    plan=plan,
    reference=reference.vec_add,
    backward=Backward(_grads),
    check_arrays=check_arrays,
    aot_cases=lambda arch: [(Meta.contiguous((4096,), d),) * 2 for d in TRITON_DTYPE_NAMES],
))  # fmt: skip

# The call cache the torch front and tests reach; the hot path of the front.
_call = VEC_ADD.call
vec_add_if_eager = VEC_ADD.if_eager


def vec_add(x: Any, y: Any, out: Any | None = None, wrap: Wrap = _identity) -> Any:
    """out = x + y for contiguous tensors of one shape, dtype and device.

    Raises GretaInputError for a wrong shape, dtype, device or layout.
    """
    if out is None:
        return _call.run(wrap, x, y)[0]
    plan, _ = _call(x, y)  # no copies: validation takes contiguous x and y only
    check_tensor(OP, "out", out, dtypes=(x.dtype,), contiguous=True)
    check_same_shape(OP, x=x, out=out)
    run(plan, (x, y), out=(out,), wrap=wrap)
    return out
