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


_IN, _OUT, _SCALAR = 0, 1, 2
# Per plan (by id, the plan kept alive beside it): its buffers and launches in the form the
# torch executor runs fastest (torch dtypes resolved, argument kinds decided, keywords
# merged, the direct launcher of each launch). Plans are memoized, so this is built once
# per call signature; clearing it also bounds the direct launchers' caches.
_TORCH_FORM: dict[int, tuple[Plan, _TorchForm]] = {}
_MAX_FORMS = 4096


@dataclass(frozen=True, slots=True)
class _TorchForm:
    allocs: list[tuple[Any, ...]]  # (alias, fill, zeroed, shape, torch dtype) per buffer
    # (shape, dtype) per buffer when all are plain empties, zeroed scratch aside (below)
    plain: list[tuple[tuple[int, ...], Any]] | None
    launches: list[tuple[Any, ...]]  # (kernel, grid, spec, keywords, DirectLaunch or None)
    empty: Callable[..., Any]  # torch.empty
    # With `plain`: the zeroed buffers, all scratch (a norm backward's program counter: a
    # ready launch takes it from the scratch arena's zeroed header, ``ops/_calls.py``).
    zeroed: tuple[int, ...] = ()


def _torch_form(plan: Plan) -> _TorchForm:
    form = _TORCH_FORM.get(id(plan))
    if form is not None and form[0] is plan:
        return form[1]
    import torch

    from greta_core.ops._direct import direct_launch

    allocs = [
        (b.alias, b.fill, b.zeroed, tuple(b.shape), getattr(torch, b.dtype)) for b in plan.buffers
    ]
    plain = None
    if all(
        a is None and f is None and (not z or i not in plan.results)
        for i, (a, f, z, _, _) in enumerate(allocs)
    ):
        plain = [(shape, dtype) for _, _, _, shape, dtype in allocs]
    zeroed = tuple(i for i, (_, _, z, _, _) in enumerate(allocs) if z) if plain else ()
    launches = []
    for launch in plan.launches:
        spec = tuple(
            (_IN, a.index) if type(a) is In else (_OUT, a.index) if type(a) is Out else (_SCALAR, a)
            for a in launch.args
        )
        keywords = {**launch.constexprs, **launch.options}
        # The interpreter (arch "cpu") keeps Triton's own path; see ops/_direct.py.
        direct = None
        if plan.arch != "cpu":
            direct = direct_launch(launch.kernel, launch.grid, spec, keywords, (_IN, _OUT))
        launches.append((launch.kernel, launch.grid, spec, keywords, direct))
    if len(_TORCH_FORM) >= _MAX_FORMS:
        _TORCH_FORM.clear()
    built = _TorchForm(allocs, plain, launches, torch.empty, zeroed)
    _TORCH_FORM[id(plan)] = (plan, built)
    return built


def run(
    plan: Plan,
    inputs: Sequence[Any],
    out: Sequence[Any] | None = None,
    wrap: Wrap = _identity,
) -> tuple[Any, ...]:
    """Execute `plan` on torch tensors; returns its result buffers.

    `out`: preallocated result buffers (in ``plan.results`` order) instead of new ones.
    `wrap`: ``torch.library.wrap_triton`` inside a ``triton_op`` (compile sees the kernel).
    Launches go through ``ops/_direct.py`` except while ``wrap`` traces.
    """
    form = _torch_form(plan)
    empty = form.empty
    device = inputs[0].device
    if out is None and form.plain is not None and not form.zeroed:
        bufs = [empty(shape, dtype=dtype, device=device) for shape, dtype in form.plain]
    else:
        bufs = _allocate(plan, form, inputs, out, device)
    # wrap_triton only changes the launch while torch traces (compile, fake tensors); in a
    # triton_op's real-tensor kernel it calls kernel[grid] itself: the direct path is that.
    direct_ok = wrap is _identity or not _wrap_triton_enabled()
    for kernel, grid, spec, keywords, direct in form.launches:
        args = [inputs[v] if k == _IN else bufs[v] if k == _OUT else v for k, v in spec]
        if direct is not None and direct_ok:
            direct(args)
        else:
            wrap(kernel)[grid](*args, **keywords)
    if form.launches:
        record(plan.op, implementation(plan.arch), plan.arch)
    return tuple([bufs[i] for i in plan.results])


@functools.cache
def _wrap_probe() -> Callable[[], bool]:
    try:
        from torch._library.triton import is_wrap_triton_enabled
    except ImportError:  # a torch without the switch: wrap_triton always keeps its path
        return lambda: True
    return is_wrap_triton_enabled


def _wrap_triton_enabled() -> bool:
    return _wrap_probe()()


def _allocate(
    plan: Plan, form: _TorchForm, inputs: Sequence[Any], out: Sequence[Any] | None, device: Any
) -> list[Any]:
    import torch

    given = dict(zip(plan.results, out, strict=True)) if out is not None else None
    bufs: list[Any] = []
    for i, (alias, fill, zeroed, shape, dtype) in enumerate(form.allocs):
        if alias is not None:
            t = inputs[alias]
        elif given is not None and i in given:
            t = given[i]
            if zeroed:
                t.zero_()
        elif fill is not None:
            t = torch.full(shape, fill, dtype=dtype, device=device)
        elif zeroed:
            t = torch.zeros(shape, dtype=dtype, device=device)
        else:
            t = torch.empty(shape, dtype=dtype, device=device)
        bufs.append(t)
    return bufs
