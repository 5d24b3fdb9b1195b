"""swiglu / geglu: validation and the launch plans that the raw API, torch.ops.greta and
JAX run. Both are ``act(gate) * up`` over same-shape contiguous tensors."""

from __future__ import annotations

import math
from typing import Any

from greta_core import configs
from greta_core.kernels.swiglu import ACTIVATIONS, glu_bwd_kernel, glu_fwd_kernel, grid
from greta_core.ops import _interp_compat
from greta_core.ops._calls import ForwardCall, eager_raw
from greta_core.ops._plan import Buffer, In, Launch, Out, Plan, Wrap, dtype_name, memo, run
from greta_core.ops._plan import _identity as _no_wrap
from greta_core.ops._rows import arch_for, float_dtypes
from greta_core.ops._validate import check_same_device, check_same_shape, check_tensor

# op name -> the kernel's activation
OPS = {"swiglu": "silu", "geglu": "gelu_tanh"}
_interp_compat.apply()


def validate(op: str, gate: Any, up: Any, reference: bool = False) -> str:
    """Check the inputs; returns the arch to launch on. Raises GretaInputError.

    The kernels take contiguous tensors (the torch ops make them so); the torch reference
    takes any strides.
    """
    check_tensor(op, "gate", gate, dtypes=float_dtypes(reference), contiguous=not reference)
    check_tensor(op, "up", up, dtypes=(gate.dtype,), contiguous=not reference)
    check_same_shape(op, gate=gate, up=up)
    check_same_device(op, gate=gate, up=up)
    return arch_for(op, gate, reference)


def validate_bwd(op: str, dy: Any, gate: Any, up: Any, reference: bool = False) -> str:
    arch = validate(op, gate, up, reference)
    check_tensor(op, "dy", dy, dtypes=(gate.dtype,), contiguous=not reference)
    check_same_shape(op, dy=dy, gate=gate)
    check_same_device(op, dy=dy, gate=gate)
    return arch


def _launch(kernel: Any, n: int, args: tuple, activation: str, arch: str) -> Launch:
    config = configs.lookup("swiglu", arch, {"N": n})
    return Launch(
        kernel, grid(n, config["BLOCK"]), args,
        {"ACT": ACTIVATIONS.index(activation), "BLOCK": config["BLOCK"]},
        configs.launch_options(config, arch),
    )  # fmt: skip


@memo
def plan_fwd(op: str, shape: tuple[int, ...], dtype: str, arch: str) -> Plan:
    """Inputs (gate, up); buffer: y (gate's shape and dtype)."""
    n = math.prod(shape)
    launch = _launch(glu_fwd_kernel, n, (In(0), In(1), n, Out(0)), OPS[op], arch)
    return Plan(op, arch, (Buffer(shape, dtype),), (launch,) if n else (), (0,))


@memo
def plan_bwd(op: str, shape: tuple[int, ...], dtype: str, arch: str) -> Plan:
    """Inputs (dy, gate, up); buffers: dgate, dup."""
    n = math.prod(shape)
    args = (In(0), In(1), In(2), n, Out(0), Out(1))
    launch = _launch(glu_bwd_kernel, n, args, OPS[op], arch)
    buffers = (Buffer(shape, dtype), Buffer(shape, dtype))
    return Plan(f"{op}_bwd", arch, buffers, (launch,) if n else (), (0, 1))


@memo
def plan_bwd_inplace(op: str, shape: tuple[int, ...], dtype: str, arch: str) -> Plan:
    """Inputs (dy, gate, up); dgate written over gate and dup over up (each element is read
    before it is written, in the same program): no [tokens, intermediate] buffers."""
    n = math.prod(shape)
    args = (In(0), In(1), In(2), n, Out(0), Out(1))
    launch = _launch(glu_bwd_kernel, n, args, OPS[op], arch)
    buffers = (Buffer(shape, dtype, alias=1), Buffer(shape, dtype, alias=2))
    return Plan(f"{op}_bwd", arch, buffers, (launch,) if n else (), (0, 1))


# --- the raw API (torch tensors; the torch ops call these with wrap=wrap_triton) ----------


def _resolve_fwd(gate: Any, up: Any, op: str) -> Plan:
    return plan_fwd(op, tuple(gate.shape), dtype_name(gate.dtype), validate(op, gate, up))


# The kernel takes gate and up as given (validation rejects other strides): no copies.
_fwd_call = ForwardCall(
    _resolve_fwd, 2, plan_inputs=lambda plan: (plan, (0, 1)),
    inputs=lambda plan, args: (plan, args[:2]),
)  # fmt: skip


def glu(op: str, gate: Any, up: Any, wrap: Wrap = _no_wrap) -> Any:
    """act(gate) * up for op "swiglu" or "geglu" (see :data:`OPS`).

    Raises GretaInputError for a wrong shape, dtype, device or layout.
    """
    return _fwd_call.run(wrap, gate, up, op)[0]


def glu_if_eager(op: str, gate: Any, up: Any) -> Any | None:
    """:func:`glu` for a call :func:`~greta_core.ops._calls.eager_raw` allows (the torch.ops
    front's hot path), else None: the caller then takes its torch op. Any strides, as the
    torch ops take them: copied only where the raw launch will run (a declined call keeps
    the training path free of copies its triton_op would make again)."""
    if not (gate.is_contiguous() and up.is_contiguous()):
        if not eager_raw(gate, up):
            return None
        gate, up = gate.contiguous(), up.contiguous()
    done = _fwd_call.if_eager(gate, up, op)
    return None if done is None else done[0]


def glu_bwd(op: str, dy: Any, gate: Any, up: Any, wrap: Wrap = _no_wrap) -> tuple[Any, Any]:
    arch = validate_bwd(op, dy, gate, up)
    plan = plan_bwd(op, tuple(gate.shape), dtype_name(gate.dtype), arch)
    return run(plan, (dy, gate, up), wrap=wrap)


def glu_bwd_inplace(op: str, dy: Any, gate: Any, up: Any, wrap: Wrap = _no_wrap) -> tuple[Any, Any]:
    """:func:`glu_bwd` into gate's and up's own memory; returns (gate, up), now (dgate, dup).

    Raises GretaInputError for a wrong shape, dtype, device or layout.
    """
    arch = validate_bwd(op, dy, gate, up)
    plan = plan_bwd_inplace(op, tuple(gate.shape), dtype_name(gate.dtype), arch)
    return run(plan, (dy, gate, up), wrap=wrap)


def swiglu(gate: Any, up: Any) -> Any:
    """silu(gate) * up (SwiGLU), same-shape contiguous tensors. No autograd (see torch.ops).

    Raises GretaInputError for a wrong shape, dtype, device or layout.
    """
    return glu("swiglu", gate, up)


def geglu(gate: Any, up: Any) -> Any:
    """gelu_tanh(gate) * up (GeGLU with the tanh-approximated GELU, as Gemma uses).

    Raises GretaInputError for a wrong shape, dtype, device or layout.
    """
    return glu("geglu", gate, up)


def swiglu_bwd(dy: Any, gate: Any, up: Any) -> tuple[Any, Any]:
    """(dgate, dup) of swiglu for dy = dL/dy."""
    return glu_bwd("swiglu", dy, gate, up)


def geglu_bwd(dy: Any, gate: Any, up: Any) -> tuple[Any, Any]:
    """(dgate, dup) of geglu for dy = dL/dy."""
    return glu_bwd("geglu", dy, gate, up)
