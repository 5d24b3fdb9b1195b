"""swiglu / geglu (``act(gate) * up``): the declarations of greta::swiglu and greta::geglu,
of their backwards' kernel ops greta::<op>_bwd, and of greta::<op>_bwd_, the backward
written over gate's and up's own memory (apply_greta's MLP, inside ``consume_inputs()``)."""

from __future__ import annotations

import math
from typing import Any

from greta_core import configs, reference
from greta_core.ops import _interp_compat
from greta_core.ops._plan import Buffer, In, Launch, Out, Plan, Wrap, _identity
from greta_core.ops._rows import (
    TRITON_DTYPE_NAMES,
    arch_for,
    check_array_float,
    check_arrays_alike,
    float_dtypes,
)
from greta_core.ops._validate import check_same_device, check_same_shape, check_tensor
from greta_core.ops.declare import Backward, Meta, OpDecl, declare

# op name -> the kernel's activation (greta_core.kernels.swiglu.ACTIVATIONS)
OPS = {"swiglu": "silu", "geglu": "gelu_tanh"}
_interp_compat.apply()


def validate(op: str, gate: Any, up: Any, reference: bool = False, contiguous: bool = False) -> str:
    """Check the inputs; returns the arch to launch on. Raises GretaInputError.

    Any strides: the kernels read contiguous copies of strided tensors (see `_strided`);
    `contiguous`: the in-place backward, which writes into gate and up themselves."""
    check_tensor(op, "gate", gate, dtypes=float_dtypes(reference), contiguous=contiguous)
    check_tensor(op, "up", up, dtypes=(gate.dtype,), contiguous=contiguous)
    check_same_shape(op, gate=gate, up=up)
    check_same_device(op, gate=gate, up=up)
    return arch_for(op, gate, reference)


def validate_bwd(
    op: str, dy: Any, gate: Any, up: Any, reference: bool = False, contiguous: bool = False
) -> str:
    arch = validate(op, gate, up, reference, contiguous)
    check_tensor(op, "dy", dy, dtypes=(gate.dtype,))
    check_same_shape(op, dy=dy, gate=gate)
    check_same_device(op, dy=dy, gate=gate)
    return arch


def _strided(*tensors: Meta) -> tuple[int, ...]:
    """The kernels index elements 0..n-1: inputs that are not contiguous are copied."""
    return tuple(i for i, t in enumerate(tensors) if not t.is_contiguous)


# --- launch plans ---------------------------------------------------------------------------


def _plan(op: str, arch: str, n_inputs: int, shape: tuple[int, ...], dtype: str,
          alias: bool) -> Plan:  # fmt: skip
    """Forward (n_inputs 2: gate, up -> y) or backward (3: dy, gate, up -> dgate, dup;
    with `alias`, dgate over gate and dup over up: each element is read before it is
    written, in the same program, so no [tokens, intermediate] buffers)."""
    from greta_core.kernels.swiglu import ACTIVATIONS, glu_bwd_kernel, glu_fwd_kernel

    n = math.prod(shape)
    config = configs.lookup("swiglu", arch, {"N": n})
    outs = tuple(Out(i) for i in range(n_inputs - 1))
    launch = Launch(
        glu_fwd_kernel if n_inputs == 2 else glu_bwd_kernel,
        ((n + config["BLOCK"] - 1) // config["BLOCK"],),
        (*(In(i) for i in range(n_inputs)), n, *outs),
        {"ACT": ACTIVATIONS.index(OPS[op]), "BLOCK": config["BLOCK"]},
        configs.launch_options(config, arch),
    )
    buffers = tuple(Buffer(shape, dtype, alias=1 + i if alias else None) for i in range(len(outs)))
    name = op if n_inputs == 2 else f"{op}_bwd"
    return Plan(name, arch, buffers, (launch,) if n else (), tuple(range(len(outs))))


# --- JAX arrays' checks, AOT cases, references of the in-place backward ---------------------


def _check_arrays(op: str) -> Any:
    def check(gate: Any, up: Any) -> None:
        check_array_float(op, "gate", gate)
        check_array_float(op, "up", up)
        check_arrays_alike(op, "gate", gate, "up", up)

    return check


def _aot(n_inputs: int) -> Any:
    # n_elements past 2**31 - 1: the kernels' element count is typed i64 in the wheels.
    def cases(arch: str) -> list[tuple[Meta, ...]]:
        return [(Meta.contiguous((2**31,), d),) * n_inputs for d in TRITON_DTYPE_NAMES]

    return cases


def _written_over(activation: str) -> Any:
    """The reference of the in-place backward: torch tensors overwritten (JAX arrays:
    the new ones, the op's functional form)."""

    def bwd_(dy: Any, gate: Any, up: Any) -> Any:
        dgate, dup = reference.glu_bwd(dy, gate, up, activation)
        if hasattr(gate, "copy_"):
            gate.copy_(dgate)
            up.copy_(dup)
            return None
        return dgate, dup

    return bwd_


def _may_overwrite(gate: Any, up: Any) -> bool:
    """The Triton backward may write over gate and up (torch tensors of a GPU kernel
    path, contiguous); the CPU reference never does."""
    kernel = str(gate.dtype).removeprefix("torch.") in TRITON_DTYPE_NAMES
    return gate.device.type != "cpu" and kernel and gate.is_contiguous() and up.is_contiguous()


# --- the declarations -------------------------------------------------------------------


def _declare(op: str) -> tuple[OpDecl, OpDecl, OpDecl]:
    activation = OPS[op]
    bwd = declare(OpDecl(
        name=f"{op}_bwd",
        schema="Tensor dy, Tensor gate, Tensor up -> (Tensor, Tensor)",
        describe=f"(dgate, dup) of {op}",
        validate=lambda *args, reference=False: validate_bwd(op, *args, reference=reference),
        plan=lambda arch, dy, gate, up: _plan(op, arch, 3, gate.shape, gate.dtype, False),
        reference=lambda dy, gate, up: reference.glu_bwd(dy, gate, up, activation),
        copies=_strided,
        front=False,
        aot_cases=_aot(3),
    ))  # fmt: skip
    bwd_ = declare(OpDecl(
        name=f"{op}_bwd_",
        schema="Tensor dy, Tensor(a!) gate, Tensor(b!) up -> ()",
        describe=f"{op}'s backward written over gate (dgate) and up (dup)",
        validate=lambda *args, reference=False: validate_bwd(
            op, *args, reference=reference, contiguous=not reference
        ),
        plan=lambda arch, dy, gate, up: _plan(op, arch, 3, gate.shape, gate.dtype, True),
        reference=_written_over(activation),
        front=False,
    ))  # fmt: skip

    def grads(call: Any, grad_outputs: tuple[Any, ...], saved: Any) -> tuple[Any, ...]:
        (dy,) = grad_outputs
        gate, up = saved.gate, saved.up
        if saved.consume and _may_overwrite(gate, up):
            # As Liger-Kernel does: two fewer [tokens, intermediate] tensors at the
            # backward's peak (0.25 GiB for a 1B Llama at 8k tokens). A second backward
            # through a retained graph then fails autograd's version check instead of
            # reading the overwritten inputs.
            call(bwd_, call.contiguous(dy), gate, up)
            return gate, up
        return call(bwd, dy, gate, up)

    fwd = declare(OpDecl(
        name=op,
        schema="Tensor gate, Tensor up -> Tensor",
        describe=f"{activation}(gate) * up",
        validate=lambda *args, reference=False: validate(op, *args, reference=reference),
        plan=lambda arch, gate, up: _plan(op, arch, 2, gate.shape, gate.dtype, False),
        reference=lambda gate, up: reference.glu(gate, up, activation),
        backward=Backward(grads, saves=("gate", "up"), may_consume=True),
        check_arrays=_check_arrays(op),
        copies=_strided,
        aot_cases=_aot(2),
    ))  # fmt: skip
    return fwd, bwd, bwd_


SWIGLU, SWIGLU_BWD, SWIGLU_BWD_ = _declare("swiglu")
GEGLU, GEGLU_BWD, GEGLU_BWD_ = _declare("geglu")
# op name -> (forward, backward, in-place backward)
DECLS = {"swiglu": (SWIGLU, SWIGLU_BWD, SWIGLU_BWD_), "geglu": (GEGLU, GEGLU_BWD, GEGLU_BWD_)}


# --- the raw API ------------------------------------------------------------------------


def glu(op: str, gate: Any, up: Any, wrap: Wrap = _identity) -> Any:
    """act(gate) * up for op "swiglu" or "geglu" (see :data:`OPS`).

    Raises GretaInputError for a wrong shape, dtype or device.
    """
    return DECLS[op][0].raw(gate, up, wrap=wrap)


def glu_if_eager(op: str, gate: Any, up: Any) -> Any | None:
    """:func:`glu` for a call :func:`~greta_core.ops._calls.eager_raw` allows (the torch.ops
    front's hot path), else None: the caller then takes its torch op."""
    return DECLS[op][0].if_eager(gate, up)


def glu_bwd(op: str, dy: Any, gate: Any, up: Any, wrap: Wrap = _identity) -> tuple[Any, Any]:
    return DECLS[op][1].raw(dy, gate, up, wrap=wrap)


def glu_bwd_inplace(
    op: str, dy: Any, gate: Any, up: Any, wrap: Wrap = _identity
) -> tuple[Any, Any]:
    """:func:`glu_bwd` into gate's and up's own memory; returns (gate, up), now (dgate, dup).

    Raises GretaInputError for a wrong shape, dtype, device or layout.
    """
    DECLS[op][2].raw(dy, gate, up, wrap=wrap)
    return gate, up


def swiglu(gate: Any, up: Any) -> Any:
    """silu(gate) * up (SwiGLU), same-shape tensors. No autograd (see torch.ops).

    Raises GretaInputError for a wrong shape, dtype or device.
    """
    return SWIGLU.raw(gate, up)


def geglu(gate: Any, up: Any) -> Any:
    """gelu_tanh(gate) * up (GeGLU with the tanh-approximated GELU, as Gemma uses).

    Raises GretaInputError for a wrong shape, dtype or device.
    """
    return GEGLU.raw(gate, up)


def swiglu_bwd(dy: Any, gate: Any, up: Any) -> tuple[Any, Any]:
    """(dgate, dup) of swiglu for dy = dL/dy."""
    return SWIGLU_BWD.raw(dy, gate, up)


def geglu_bwd(dy: Any, gate: Any, up: Any) -> tuple[Any, Any]:
    """(dgate, dup) of geglu for dy = dL/dy."""
    return GEGLU_BWD.raw(dy, gate, up)
