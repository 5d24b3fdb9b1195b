"""Execute a launch plan (``greta_core.ops._plan``) through ``jax_triton.triton_call``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from greta_core.observe import record
from greta_core.ops._plan import In, Out, Plan

# jax-triton takes num_warps/num_stages only; any other keyword would become a constexpr,
# so the HIP knobs of a plan (waves_per_eu, ...) cannot reach the compiler through JAX.
_JAX_OPTIONS = ("num_warps", "num_stages")


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
        unaliased = [
            plan.buffers[j].alias for k, j in enumerate(written)
            if plan.buffers[j].alias is not None and k not in aliases.values()
        ]  # fmt: skip
        if unaliased:  # jax-triton would hand the kernel a fresh, uninitialised buffer
            raise RuntimeError(
                f"{plan.op}: the launch updates input(s) {unaliased} in place without taking "
                "them as inputs; jax-triton can alias an output only to an input argument"
            )
        results = jt.triton_call(
            *args,
            kernel=launch.kernel,
            out_shape=[jax.ShapeDtypeStruct(b.shape, jnp.dtype(b.dtype)) for b in specs],
            grid=launch.grid,
            input_output_aliases=aliases,
            zeroed_outputs=tuple(k for k, b in enumerate(specs) if b.zeroed),
            **{k: v for k, v in launch.options.items() if k in _JAX_OPTIONS},
            **launch.constexprs,
        )
        bufs.update(zip(written, results, strict=True))
    if plan.launches:
        record(plan.op, "jax-triton", plan.arch)
    return tuple(bufs[i] if i in bufs else _new(plan.buffers[i], inputs) for i in plan.results)
