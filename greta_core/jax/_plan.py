"""Execute a launch plan (``greta_core.ops._plan``) through ``jax_triton.triton_call``."""

from __future__ import annotations

import inspect
import logging
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from greta_core.errors import PlanError
from greta_core.observe import record
from greta_core.ops._plan import In, Out, Plan

logger = logging.getLogger("greta")

# The compile options jax-triton 0.3.1 (the release for triton 3.6) hands to the compiler:
# its triton_call builds the backend options from num_warps/num_stages/num_ctas alone and
# turns every other keyword into a kernel constexpr, so a plan's HIP knobs (waves_per_eu,
# matrix_instr_nonkdim, kpack) cannot reach the compiler through JAX: they are dropped here,
# on purpose and in this one place. jax-triton 0.4 takes them as `backend_options` but
# needs triton >= 3.7.
JAX_OPTIONS = ("num_warps", "num_stages")


def split_options(options: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """(the options passed to triton_call, the names dropped): see JAX_OPTIONS."""
    passed = {k: v for k, v in options.items() if k in JAX_OPTIONS}
    return passed, tuple(sorted(k for k in options if k not in JAX_OPTIONS))


def jax_triton_convention(version: str) -> str:
    """How a jax-triton release binds a kernel's output parameters.

    "appended" (0.3.x): every output, aliased ones included, is a kernel parameter after
    the inputs, filled from the call's output buffers in order; ``input_output_aliases``
    maps an input position to the output it becomes.
    "operand" (0.4+): only outputs aliased to no operand fill the missing parameters, and
    the aliased ones are written through their operand's parameter. GRETA's kernels keep
    a parameter per output (0.3's layout), so every output parameter gets an operand of
    its own (the aliased input, or a fresh buffer filled like the plan's), aliased to its
    output: the parameters then take the operand buffers in order, as under 0.3.
    """
    parts = re.match(r"^(\d+)\.(\d+)", version or "")
    if parts and (int(parts.group(1)), int(parts.group(2))) <= (0, 3):
        return "appended"
    return "operand"


def call_form(
    param_names: Sequence[str],
    lead: Sequence[Any],
    specs: Sequence[Any],
    aliases: Mapping[int, int],
    convention: str,
    new: Callable[[Any], Any],
) -> tuple[list[Any], dict[str, Any], dict[int, int], bool]:
    """(positional operands, keyword operands, input_output_aliases, pass zeroed_outputs)
    for ``triton_call``.

    `lead`: the launch's arguments ahead of its outputs (kernel parameter order); `specs`:
    the output buffers (the trailing parameters); `aliases`: {position in lead: output};
    `new(buffer)`: the array an output starts as (the aliased input, zeros, a fill).
    """
    if convention == "appended":
        return list(lead), {}, dict(aliases), True
    keywords = {param_names[len(lead) + k]: new(b) for k, b in enumerate(specs)}
    # Operands are numbered in parameter order: the lead, then one per output.
    return list(lead), keywords, {len(lead) + k: k for k in range(len(specs))}, False


def _runtime_params(kernel: Any) -> list[str]:
    """The kernel's non-constexpr parameter names, in order (what operands bind to)."""
    params = getattr(kernel, "params", None) or getattr(getattr(kernel, "fn", None), "params", None)
    if params:  # a JITFunction (or an autotuner around one)
        return [p.name for p in params if not p.is_constexpr]
    fn = kernel  # the interpreter's InterpretedFunction: the Python function's signature
    while hasattr(fn, "fn"):
        fn = fn.fn
    signature = inspect.signature(fn)
    return [n for n, p in signature.parameters.items() if "constexpr" not in str(p.annotation)]


def _new(buffer: Any, inputs: Sequence[Any]) -> Any:
    import jax.numpy as jnp

    if buffer.alias is not None:
        return inputs[buffer.alias]
    if buffer.fill is not None:
        return jnp.full(buffer.shape, buffer.fill, jnp.dtype(buffer.dtype))
    make = jnp.zeros if buffer.zeroed else jnp.empty
    return make(buffer.shape, jnp.dtype(buffer.dtype))


def run(plan: Plan, inputs: Sequence[Any]) -> tuple[Any, ...]:
    """The plan's result arrays; buffers no launch writes are zeros (or the aliased input)."""
    import jax
    import jax.numpy as jnp
    import jax_triton as jt

    convention = jax_triton_convention(getattr(jt, "__version__", ""))
    bufs: dict[int, Any] = {}
    for launch in plan.launches:
        written = launch.written()
        lead = launch.args[: len(launch.args) - len(written)]
        for a in lead:  # a buffer read before any launch wrote it (e.g. a filled one)
            if type(a) is Out and a.index not in bufs:
                bufs[a.index] = _new(plan.buffers[a.index], inputs)
        args = [
            inputs[a.index] if type(a) is In else bufs[a.index] if type(a) is Out else a
            for a in lead
        ]
        specs = [plan.buffers[j] for j in written]
        aliases = {
            pos: k
            for k, b in enumerate(specs)
            if b.alias is not None
            for pos, a in enumerate(lead)
            if type(a) is In and a.index == b.alias
        }
        passed, dropped = split_options(launch.options)
        if dropped:
            logger.debug("greta: %s under JAX drops compile options %s", plan.op, dropped)
        unaliased = [
            plan.buffers[j].alias for k, j in enumerate(written)
            if plan.buffers[j].alias is not None and k not in aliases.values()
        ]  # fmt: skip
        if unaliased:  # jax-triton would hand the kernel a fresh, uninitialised buffer
            raise PlanError(
                f"{plan.op}: the launch updates input(s) {unaliased} in place without taking "
                "them as inputs; jax-triton can alias an output only to an input argument"
            )
        names = _runtime_params(launch.kernel)
        args, operands, io_aliases, pass_zeroed = call_form(
            names, args, specs, aliases, convention, lambda b: _new(b, inputs)
        )
        zeroed = tuple(k for k, b in enumerate(specs) if b.zeroed) if pass_zeroed else ()
        with warnings.catch_warnings():
            # jax-triton 0.4 deprecates both in favour of Refs, which jax 0.10 (the CPU
            # row's) lacks: the same call serves every release the lock pins.
            warnings.filterwarnings(
                "ignore", "(input_output_aliases|zeroed_outputs|out_shape=) is deprecated"
            )
            results = jt.triton_call(
                *args,
                kernel=launch.kernel,
                out_shape=[jax.ShapeDtypeStruct(b.shape, jnp.dtype(b.dtype)) for b in specs],
                grid=launch.grid,
                **({"input_output_aliases": io_aliases} if io_aliases else {}),
                **({"zeroed_outputs": zeroed} if zeroed else {}),
                **passed,
                **operands,
                **launch.constexprs,
            )
        bufs.update(zip(written, results, strict=True))
    if plan.launches:
        record(plan.op, "jax-triton", plan.arch)
    return tuple(bufs[i] if i in bufs else _new(plan.buffers[i], inputs) for i in plan.results)
