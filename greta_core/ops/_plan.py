"""Launch plans: what one call of an op launches, written once, executed by every binding.

A :class:`Plan` is framework-free data: the buffers to allocate (:class:`Buffer`), and the
ordered :class:`Launch` list (kernel, grid, positional arguments, constexprs, options).
Arguments are scalars or references: ``In(i)`` is the call's i-th input, ``Out(j)`` its
j-th buffer. Kernels take their written buffers last (jax-triton's convention), so the
trailing ``Out`` references of a launch are what it writes.

``ops/<op>.py`` builds the plan from shapes, strides and dtype names (memoized per call
signature: see :func:`memo`); :func:`run` executes it on torch tensors (the raw API, and
the torch ops with ``wrap=torch.library.wrap_triton``); ``greta_core.jax._plan`` executes
the same plan through ``jax_triton.triton_call``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from greta_core.observe import record

Wrap = Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class In:
    """The call's ``index``-th input tensor."""

    index: int


@dataclass(frozen=True, slots=True)
class Out:
    """The plan's ``index``-th buffer (an output or scratch it allocates)."""

    index: int


@dataclass(frozen=True, slots=True)
class Buffer:
    """A tensor the plan allocates: shape, dtype name ("float32", "bfloat16", "int32")."""

    shape: tuple[int, ...]
    dtype: str
    zeroed: bool = False  # filled with zeros before any launch (also when nothing launches)
    alias: int | None = None  # updated in place: the input with this index (no allocation)
    fill: float | None = None  # filled with this value (e.g. a full-length lengths vector)


@dataclass(frozen=True, slots=True)
class Launch:
    kernel: Any  # the @triton.jit function
    grid: tuple[int, ...]
    args: tuple[Any, ...]  # In / Out references and scalars, in the kernel's order
    constexprs: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)  # num_warps, num_stages, HIP knobs

    def written(self) -> tuple[int, ...]:
        """Buffers this launch writes: its trailing ``Out`` arguments."""
        out: list[int] = []
        for arg in reversed(self.args):
            if not isinstance(arg, Out):
                break
            out.append(arg.index)
        return tuple(reversed(out))


@dataclass(frozen=True, slots=True)
class Plan:
    op: str  # recorded in greta_core.observe after the launches
    arch: str
    buffers: tuple[Buffer, ...]
    launches: tuple[Launch, ...]
    results: tuple[int, ...]  # the buffers the call returns, in order (the rest is scratch)


def dtype_name(dtype: Any) -> str:
    """ "torch.bfloat16" / numpy's "bfloat16" -> "bfloat16": the name plans use."""
    return str(dtype).rsplit(".", 1)[-1]


def memo(build: Callable[..., Plan]) -> Callable[..., Plan]:
    """Memoize a plan builder on its (hashable) arguments: one dict lookup per call.

    Under torch.compile shapes may be SymInts (unhashable): those calls build afresh. The
    cache is keyed on ``configs.lookup`` too, so ``greta tune`` swapping it never sees a
    stale plan.
    """
    from greta_core import configs

    @functools.lru_cache(maxsize=4096)
    def cached(lookup: Any, *args: Any) -> Plan:
        return build(*args)

    @functools.wraps(build)
    def plan(*args: Any) -> Plan:
        try:
            return cached(configs.lookup, *args)
        except TypeError:  # an unhashable (symbolic) argument
            return build(*args)

    plan.cache_clear = cached.cache_clear  # type: ignore[attr-defined]
    return plan


def _identity(kernel: Any) -> Any:
    return kernel


def implementation(arch: str) -> str:
    return "triton-interpret" if arch == "cpu" else "triton"


def run(
    plan: Plan,
    inputs: Sequence[Any],
    out: Sequence[Any] | None = None,
    wrap: Wrap = _identity,
) -> tuple[Any, ...]:
    """Execute `plan` on torch tensors; returns its result buffers.

    `out`: preallocated result buffers (in ``plan.results`` order) instead of new ones.
    `wrap`: ``torch.library.wrap_triton`` inside a ``triton_op`` (compile sees the kernel).
    """
    import torch

    device = inputs[0].device
    given = dict(zip(plan.results, out, strict=True)) if out is not None else {}
    bufs: list[Any] = []
    for i, b in enumerate(plan.buffers):
        if b.alias is not None:
            t = inputs[b.alias]
        elif i in given:
            t = given[i]
            if b.zeroed:
                t.zero_()
        elif b.fill is not None:
            t = torch.full(b.shape, b.fill, dtype=getattr(torch, b.dtype), device=device)
        else:
            make = torch.zeros if b.zeroed else torch.empty
            t = make(b.shape, dtype=getattr(torch, b.dtype), device=device)
        bufs.append(t)
    for launch in plan.launches:
        args = [
            inputs[a.index] if type(a) is In else bufs[a.index] if type(a) is Out else a
            for a in launch.args
        ]
        wrap(launch.kernel)[launch.grid](*args, **launch.constexprs, **launch.options)
    if plan.launches:
        record(plan.op, implementation(plan.arch), plan.arch)
    return tuple(bufs[i] for i in plan.results)
