"""greta_core.jax.<name> for a declared op (``greta_core.ops.declare``): a ``custom_vjp``
whose forward and backward run the declared plans through jax-triton on a GPU, and the
declared reference (``jax.numpy``) elsewhere or for dtypes the kernels do not take."""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

from greta_core.observe import record
from greta_core.ops.declare import Caller, Meta, NoContext, OpDecl


def _triton_ok(op: OpDecl, tensors: tuple[Any, ...]) -> bool:
    from greta_core.jax._runtime import use_triton

    given = [t for t in tensors if t is not None]
    floats = [t for t in given if "float" in str(t.dtype)]
    # An empty input takes the reference: no zero-size buffers through jax-triton.
    ok = all(str(t.dtype) in op.kernel_dtypes for t in floats) and all(t.size for t in given)
    if ok and op.kernel_takes is not None:
        metas = [None if t is None else Meta.contiguous(t.shape, t.dtype) for t in tensors]
        ok = op.kernel_takes(*metas)
    return ok and use_triton()


def _run_plan(op: OpDecl, plan_of: Callable[[str], Any], arrays: tuple[Any, ...]) -> Any:
    """What a `jax_body` launches with: ``plan_of(arch)`` on `arrays` through jax-triton,
    or None where the kernels do not take them (the body's fallback runs)."""
    if not _triton_ok(op, arrays):
        return None
    from greta_core.jax._plan import run
    from greta_core.jax._runtime import jax_arch

    return tuple(run(plan_of(jax_arch()), arrays))


def forward(op: OpDecl, args: tuple[Any, ...], stats: bool = False) -> tuple[Any, ...]:
    """The outputs of `op` on JAX arrays (no autograd), the statistics too with `stats`:
    the plan, else the reference."""
    n = op.n_tensors
    tensors = args[:n]
    n_results = len(op.mutates) + op.n_outputs  # without the statistics
    if op.jax_body is not None:  # its own kernels-or-fallback choice (OpDecl.body)
        outs = tuple(op.jax_body(functools.partial(_run_plan, op), *args, stats=stats))
    elif _triton_ok(op, tensors):
        from greta_core.jax._plan import run
        from greta_core.jax._runtime import jax_arch

        metas = [None if t is None else Meta.contiguous(t.shape, t.dtype) for t in tensors]
        # Always the plan with the statistics: the y-only plan hands the kernel y's buffer
        # for them (its stores off), and jax-triton gives each trailing output a buffer of
        # its own, so y would come back from the wrong one.
        outs = tuple(run(op.plan_for(jax_arch(), metas, args[n:], True), tensors))
    else:
        record(op.name, "reference-jnp")
        out = op.reference(*args)
        # A mutating op's JAX reference returns every result as a tuple (as its plan does).
        many = op.mutates or n_results + len(op.stats) > 1
        outs = tuple(out) if many else (out,)
    return outs if stats else outs[:n_results]


def implementation(op: OpDecl, *args: Any) -> Any:
    """The forward of `op` on JAX arrays (no autograd): the plan, else the reference. An
    op that writes into its arguments returns every result, the updated arrays first (JAX
    arrays are immutable); the others, the schema's outputs."""
    outs = forward(op, args)
    return outs if op.mutates else op.unpack(outs)


def _zeros_like(a: Any) -> Any:
    import jax.numpy as jnp

    return jnp.zeros_like(a)


_call = Caller(implementation, lambda a: a, _zeros_like)


@functools.cache
def _vjp(op: OpDecl) -> Callable[..., Any]:
    import jax

    backward = op.backward
    nondiff = tuple(i for i, a in enumerate(op.args) if not a.is_tensor)
    if backward is None:
        return functools.partial(implementation, op)

    @functools.partial(jax.custom_vjp, nondiff_argnums=nondiff)
    def f(*args: Any) -> Any:
        return implementation(op, *args)

    def fwd(*args: Any) -> tuple[Any, Any]:
        outs = forward(op, args, stats=True)
        saved = op.saved(args, outs)
        tensors = {k: v for k, v in vars(saved).items() if k not in scalars}
        return op.unpack(outs[: op.n_outputs]), tensors

    scalars = {op.args[i].name for i in nondiff}
    # Under JAX every input's gradient is asked for; nothing is ever consumed.
    extra = {"needs_grad": (True,) * len(op.args)}
    if backward.may_consume:
        extra["consume"] = False

    def bwd(*rest: Any) -> tuple[Any, ...]:
        *fixed, residual, grad = rest
        saved = types.SimpleNamespace(
            **residual, **{op.args[i].name: v for i, v in zip(nondiff, fixed, strict=True)},
            **extra,
        )  # fmt: skip
        grads = backward.grads(_call, grad if op.n_outputs > 1 else (grad,), saved)
        return tuple(g for i, g in enumerate(grads) if i not in nondiff)

    f.defvjp(fwd, bwd)
    return f


def _traced(args: tuple[Any, ...]) -> bool:
    import jax

    return any(isinstance(a, jax.core.Tracer) for a in args)


def _checked(op: OpDecl, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    full = op.bind(args, kwargs)
    if op.check_arrays is not None:
        op.check_arrays(*full)
    if op.check_values is not None and not _traced(full):
        op.check_values(*full)
    return full


def bind(op: OpDecl) -> Callable[..., Any]:
    """The public JAX function of `op`: checked, defaults filled, differentiable."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return _vjp(op)(*_checked(op, args, kwargs))

    call.__name__ = call.__qualname__ = op.name
    call.__doc__ = f"{op.describe}\n\nJAX binding of the declared op {op.name!r}."
    return call


def bind_public(op: OpDecl) -> Callable[..., Any]:
    """The public JAX function of `op`'s ``Front`` (a kernel op whose trailing flags each
    call's context decides): JAX tells the flags nothing (``NoContext``: no backward is
    known to follow, no input is the op's to overwrite); no other implementation runs."""
    spec = op.public
    assert spec is not None
    n_out = spec.n_outputs

    def call(*args: Any, **kwargs: Any) -> Any:
        given = spec.bind(args, kwargs)
        outs = _vjp(op)(*_checked(op, (*given, *spec.flags(NoContext, *given)), {}))
        if op.n_outputs == n_out:  # the kernel op returns the public outputs as they are
            return outs
        return outs[0] if n_out == 1 else outs[:n_out]

    call.__name__ = call.__qualname__ = spec.name
    call.__doc__ = f"{op.describe}\n\nJAX binding of the declared op {spec.name!r}."
    return call


def bind_fwd(op: OpDecl, name: str) -> Callable[..., Any]:
    """`op`'s outputs and statistics (attention's logsumexp), as one tuple: forward only."""

    def call(*args: Any, **kwargs: Any) -> tuple[Any, ...]:
        outs = forward(op, _checked(op, args, kwargs), stats=True)
        return tuple(outs[len(op.mutates) :])

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"{op.describe}, with its statistics {op.stats}; forward only (JAX)."
    return call
