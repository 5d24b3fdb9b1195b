"""The eager hot path: what a call signature resolved to, and when torch.ops can be skipped.

See docs/en/architecture.md ("the eager hot path") and ``ops/rms_norm.py`` for the use.
"""

from __future__ import annotations

import functools
import math
import operator
import threading
from collections.abc import Callable
from typing import Any

from greta_core import configs, observe
from greta_core.observe import record
from greta_core.ops import _direct
from greta_core.ops._direct import ALIGN_MASK
from greta_core.ops._plan import (
    _IN,
    _OUT,
    _SCALAR,
    Plan,
    _identity,
    _torch_form,
    _wrap_triton_enabled,
    implementation,
    run,
)

# resolution -> (plan, positions in the call's arguments of the plan's inputs), or None
# where the plan's inputs are not the call's tensors as given (a copy, a view).
PlanInputs = Callable[[Any], "tuple[Plan, tuple[int, ...]] | None"]
# A signature whose plan cannot launch ready (see CallCache.launch_args): the ordinary path.
_ORDINARY = False
# What observe.record last saw per op: a ready launch calls record only when it changes
# (the same as calling it each time, less a Python frame per launch).
_recorded = observe.recorded


class CallCache:
    """What a call signature resolved to (arch, plan, layout flags): a hit skips validation
    and planning, so an eager call pays one key build and one dict lookup.

    The key holds each tensor's dtype, device, shape and strides, the other arguments as
    they are, and ``configs.lookup`` (``greta tune`` swaps it). Only successful resolutions
    are stored, so bad input raises on every call. A key that cannot be built or hashed
    (torch.compile's symbolic sizes, a non-tensor where a tensor belongs) resolves afresh.

    With `plan_inputs`, :meth:`launch_args` runs the whole call from one lookup of the same key
    plus the 16-byte alignment of each tensor (see docs/en/architecture.md, "the eager hot
    path").
    """

    def __init__(
        self,
        resolve: Callable[..., Any],
        n_tensors: int,
        maxsize: int = 4096,
        plan_inputs: PlanInputs | None = None,
    ):
        self._resolve = resolve
        self._n = n_tensors
        self._maxsize = maxsize
        self._entries: dict[Any, Any] = {}
        self._plan_inputs = plan_inputs
        # Signature + alignment -> a ReadyLaunch, or _ORDINARY for a plan that cannot.
        self._ready: dict[Any, Any] = {}

    def __call__(self, *args: Any) -> Any:
        try:
            key: tuple[Any, ...] = (configs.lookup, *args[self._n :])
            for t in args[: self._n]:
                key += (t.dtype, t.device, t.shape, t.stride()) if t is not None else (None,)
            return self._entries[key]
        except KeyError:
            value = self._resolve(*args)
            if len(self._entries) >= self._maxsize:
                self._entries.clear()
            self._entries[key] = value
            return value
        except (TypeError, AttributeError):  # unhashable (symbolic) or not a tensor
            return self._resolve(*args)

    def launch_args(self, wrap: Any, eager: bool, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """The call's result buffers, launched through its ready launch; None where the
        caller must take the ordinary path (resolve, then ``_plan.run``). `args`: the
        call's arguments as one tuple (no repacking on the hot path).

        One key (the signature of ``__call__`` plus each tensor's 16-byte alignment: with
        the dtypes, what Triton specializes on) and one lookup give the buffers to allocate
        and the compiled kernel to launch. A miss runs the ordinary path here (validation
        and errors included) and keeps what it captured for the next call.

        `eager`: the call comes from a torch.ops front and may launch only where
        :func:`eager_raw` would allow it; None also when it would not (the same checks,
        made in the key's pass over the tensors: one pass, not two, on the hot path).
        """
        if wrap is not _identity and _wrap_triton_enabled():
            return None  # torch is tracing: wrap_triton must see the launch
        if eager:  # eager_raw's checks, inline: the hottest path GRETA has
            probes = _PROBES or _eager_probes()
            if probes is None:
                return None
            # No compiling() here: eager=True comes only from the torch.ops fronts, which
            # the dispatcher runs (dynamo never traces into them; a tracer below it holds
            # fake tensors, caught by the type check, or a dispatch mode, caught here).
            _, dispatch_modes, function_modes, grad_enabled, plain, _ = probes
            if dispatch_modes() or function_modes():
                return None
            grad = grad_enabled()
        ptrs: list[int | None] = []
        try:
            key: tuple[Any, ...] = (configs.lookup, *args[self._n :])
            for t in args[: self._n]:
                if t is None:
                    key += (None,)
                    ptrs.append(None)
                else:
                    cuda = t.is_cuda
                    if eager and (type(t) not in plain or not cuda or (grad and t.requires_grad)):
                        return None
                    p = t.data_ptr()
                    # (is_cuda, index) for t.device: no torch.device built, hashed, compared.
                    # Exact for CUDA/ROCm tensors, the only ones a ReadyLaunch is built for;
                    # another device type's call finds _ORDINARY or nothing, and the
                    # ordinary path resolves by __call__'s key (t.device itself).
                    key += (t.dtype, cuda, t.get_device(), t.shape, t.stride(), p & ALIGN_MASK == 0)
                    ptrs.append(p)
            ready = self._ready.get(key)
        except (TypeError, AttributeError, RuntimeError):  # symbolic, not a tensor, no data
            return None
        if ready is None:
            return self._prepare(key, args)
        if ready is _ORDINARY:
            return None
        return ready.launch(args, ptrs)

    def _prepare(self, key: tuple[Any, ...], args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        resolved = self(*args)
        given = self._plan_inputs(resolved) if self._plan_inputs is not None else None
        if given is None:
            self._store(key, _ORDINARY)
            return None
        plan, positions = given
        if not ReadyLaunch.fits(plan):
            self._store(key, _ORDINARY)
            return None
        inputs = tuple([args[i] for i in positions])
        results = run(plan, inputs)
        ready = ReadyLaunch.build(plan, inputs, positions, results, self._n)
        if ready is not None:  # None until Triton's path has compiled and captured it
            self._store(key, ready)
        return results

    def _store(self, key: tuple[Any, ...], value: Any) -> None:
        if len(self._ready) >= self._maxsize:
            self._ready.clear()
        self._ready[key] = value

    def clear(self) -> None:
        self._entries.clear()
        self._ready.clear()


# resolution, the call's arguments -> (plan, the plan's inputs) for the ordinary path (rows
# copied where they do not flatten).
OrdinaryInputs = Callable[[Any, tuple[Any, ...]], "tuple[Plan, tuple[Any, ...]]"]


class ForwardCall(CallCache):
    """A forward's :class:`CallCache` that runs the whole call: the ready launch, else the
    ordinary path (resolve, `inputs`, ``_plan.run``)."""

    def __init__(
        self,
        resolve: Callable[..., Any],
        n_tensors: int,
        plan_inputs: PlanInputs,
        inputs: OrdinaryInputs,
    ):
        super().__init__(resolve, n_tensors, plan_inputs=plan_inputs)
        self._inputs = inputs

    def run(self, wrap: Any, *args: Any) -> tuple[Any, ...]:
        """The call's result buffers. Raises what validation raises."""
        done = self.launch_args(wrap, False, args)
        return done if done is not None else self._ordinary(wrap, args)

    def launch(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """:meth:`run` with no wrap, `args` as one tuple: the eager training path's forward
        and backward launches (no repacking)."""
        done = self.launch_args(_identity, False, args)
        return done if done is not None else self._ordinary(_identity, args)

    def if_eager(self, *args: Any) -> tuple[Any, ...] | None:
        """:meth:`run` for a call :func:`eager_raw` allows (a torch.ops front's hot path:
        ``launch_args(..., True, ...)`` makes its checks in the key's pass), else None: the
        front then calls its torch op."""
        done = self.launch_args(_identity, True, args)
        if done is None and eager_raw(*args[: self._n]):  # no ready launch (rows copied)
            return self._ordinary(_identity, args)  # the lookup above already missed
        return done

    def _ordinary(self, wrap: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        plan, inputs = self._inputs(self(*args), args)
        return run(plan, inputs, wrap=wrap)


def tensors_as_given(n_tensors: int) -> tuple[PlanInputs, OrdinaryInputs]:
    """(plan_inputs, inputs) of a :class:`ForwardCall` whose resolve returns the plan and
    whose plan takes the call's first `n_tensors` arguments as given (any strides, no
    copy): every signature may get a ready launch."""
    positions = tuple(range(n_tensors))
    return (lambda plan: (plan, positions), lambda plan, args: (plan, args[:n_tensors]))


def _at_positions(
    resolved: tuple[Plan, tuple[int, ...]], args: tuple[Any, ...]
) -> tuple[Plan, tuple[Any, ...]]:
    plan, positions = resolved
    return plan, tuple([args[i] for i in positions])


def positions_as_given() -> tuple[PlanInputs, OrdinaryInputs]:
    """(plan_inputs, inputs) of a :class:`ForwardCall` whose resolve returns (plan, the
    positions in the call's arguments of the plan's inputs), taken as given: optional
    tensors (None) are simply not among them."""
    return (lambda resolved: resolved, _at_positions)


def forward_calls(
    resolve: Callable[..., Any], n_tensors: int, plan_inputs: PlanInputs, inputs: OrdinaryInputs
) -> tuple[ForwardCall, ForwardCall]:
    """(with stats, y only): a norm's forward for a call a backward may follow, and for one
    no backward follows (the raw API, a torch.ops front's no-grad path), whose plan neither
    stores nor allocates the saved statistics (one allocation or two fewer per call).
    `resolve` gets which of the two as its keyword ``stats``."""
    with_stats, y_only = (
        ForwardCall(functools.partial(resolve, stats=stats), n_tensors, plan_inputs, inputs)
        for stats in (True, False)
    )
    return with_stats, y_only


class ReadyLaunch:
    """A plan of plain buffers whose every launch the direct launcher (``ops/_direct.py``)
    captured for one specialization: allocate the buffers, launch each kernel, record.

    Built only from a call that ran the ordinary path and found every kernel captured, so
    the specialization rules stay those of ``_direct.py``: the signature key fixes the
    dtypes, the key's alignment bits the inputs' alignment, and each call checks the
    buffers' alignment (fresh buffers: 16-byte aligned unless an unusual allocator says
    otherwise) and the current device. Pointers reach Triton's launcher as integers (as
    ``data_ptr()`` gives them; the launcher accepts both).

    The launchers' arguments are assembled at build time as one pick per launch (``_pick``,
    an ``operator.itemgetter``) from ``_consts + pointers + buffer pointers + [stream]``:
    the grids, the arguments between stream and kernel, the scalars and trailing
    parameters are fixed per launch, so a call only appends what changes and picks in one
    C call per kernel. A plan of several launches (a backward's kernel and its reduction)
    or with scratch buffers (partial sums, not among the results) is served the same way:
    the ordinary path would pay the direct launcher's key and lookup once per kernel.

    Scratch buffers take no allocation of their own: they are carved from the current
    stream's scratch arena (:func:`scratch_arena`), see there why that is safe. A zeroed
    scratch buffer (a norm backward's count of finished programs, ``norm_bwd_plan``) comes
    from the arena's header, zeroed once when the arena is made and left zero by every
    kernel that uses it: no memset per call. While the stream captures a CUDA graph (no
    arena) such a plan takes the ordinary path, which allocates it zeroed; a plan whose
    zeroed buffers cannot come from the header takes it always (:meth:`fits`).
    """

    __slots__ = (
        "_allocs", "_arch", "_args", "_capturing", "_consts", "_empty", "_empty_like", "_fn",
        "_get_device", "_get_stream", "_impl", "_index", "_launches", "_more", "_more_hooks",
        "_one", "_op", "_pick", "_positions", "_pre_run_hooks", "_quiet", "_results",
        "_scratch", "_source", "_u8", "_zeroed",
    )  # fmt: skip

    def __init__(self, **fields: Any) -> None:
        for name, value in fields.items():
            setattr(self, f"_{name}", value)

    @staticmethod
    def fits(plan: Plan) -> bool:
        """Launches, each with a direct launcher, and every buffer a plain empty one or a
        zeroed scratch buffer the arena's header holds."""
        form = _torch_form(plan)
        return (
            bool(form.launches)
            and form.plain is not None
            and all(launch[4] is not None for launch in form.launches)
            and _arena_offsets(form.plain, plan.results, form.zeroed) is not None
        )

    @classmethod
    def build(
        cls, plan: Plan, inputs: tuple[Any, ...], positions: tuple[int, ...],
        results: tuple[Any, ...], n_tensors: int,
    ) -> ReadyLaunch | None:  # fmt: skip
        """`n_tensors`: how many pointers the call passes (its tensor arguments, None
        included), ahead of the buffers' in the picks' source. `results`: what the
        ordinary run returned (``plan.results``' buffers)."""
        import torch

        form = _torch_form(plan)  # fits(plan) holds
        directs = [launch[4] for launch in form.launches]
        if not all(direct.usable() for direct in directs):
            return None
        get_device, get_stream = _direct._driver()
        index = get_device()
        every = plan.results == tuple(range(len(plan.buffers)))
        bufs = list(results)
        if not every:  # scratch buffers too: the keys fresh ones give
            device = inputs[0].device
            bufs = [form.empty(shape, dtype=dtype, device=device) for shape, dtype in form.plain]
        if any(b.data_ptr() & ALIGN_MASK for b in bufs):
            return None
        blocks = []
        for _, _, spec, _, direct in form.launches:
            args = [inputs[v] if k == _IN else bufs[v] if k == _OUT else v for k, v in spec]
            captured = direct.captured(args, index)
            if captured is None:
                return None
            blocks.append((spec, captured))
        layout = _arena_offsets(form.plain, plan.results, form.zeroed)
        if layout is None:  # fits(plan) holds: not reached
            return None
        at, scratch = layout
        allocs = []
        for i, ((shape, dtype), offset) in enumerate(zip(form.plain, at, strict=True)):
            like = _like(inputs, positions, shape, dtype)
            template = None
            if like is None and offset is None:
                template = _template(inputs[0], shape, dtype)
            allocs.append((like, shape, dtype, template, offset, i in form.zeroed))
        # Triton 3.7+'s C launcher takes the kernel's arguments as one sequence
        # (``_direct._packed``): it is called here with a second pick for them, without the
        # wrapper's Python frame and repacking.
        forms = [(getattr(fn, "c_launch", None), fn, grid, between, tail)
                 for _, (fn, grid, between, tail) in blocks]  # fmt: skip
        forms = [
            (fn, grid, between, tail, None) if c_launch is None
            else (c_launch, grid, fn.head, tail, len(fn.head))
            for c_launch, fn, grid, between, tail in forms
        ]  # fmt: skip
        # The picks' source: each launch's [grid, between, scalars, tail], then the call's
        # pointers, the buffers' and the stream; the launcher's order: grid, stream,
        # between, kernel arguments, tail.
        consts: list[Any] = []
        for (spec, _), (_, grid, between, tail, _) in zip(blocks, forms, strict=True):
            consts += [*grid, *between, *[v for k, v in spec if k == _SCALAR], *tail]
        at_ptr = len(consts)
        at_out = at_ptr + n_tensors
        at_stream = at_out + len(allocs)
        launchers, base = [], 0
        for (spec, _), (fn, grid, between, tail, packed) in zip(blocks, forms, strict=True):
            n_head = len(grid) + len(between)
            order = [base, base + 1, base + 2, at_stream, *range(base + 3, base + n_head)]
            n_scalars = 0
            for k, v in spec:
                if k == _IN:
                    order.append(at_ptr + positions[v])
                elif k == _OUT:
                    order.append(at_out + v)
                else:
                    order.append(base + n_head + n_scalars)
                    n_scalars += 1
            order += range(base + n_head + n_scalars, base + n_head + n_scalars + len(tail))
            base += n_head + n_scalars + len(tail)
            head, rest = (
                (order, None) if packed is None else (order[: 4 + packed], order[4 + packed :])
            )
            if rest is not None and len(rest) < 2:  # itemgetter of one index gives no tuple
                return None
            launchers.append((fn, operator.itemgetter(*head),
                              None if rest is None else operator.itemgetter(*rest)))  # fmt: skip
        # Each kernel's pre-run hooks (lists that grow in place): the first kernel's checked
        # on every call, the others' where a plan has more than one.
        quiet, hooks = directs[0].usable_parts()
        more_hooks = tuple(direct.usable_parts()[1] for direct in directs[1:])
        single = len(blocks) == 1 and len(allocs) == 1 and every
        return cls(
            op=plan.op, impl=implementation(plan.arch), arch=plan.arch, allocs=allocs,
            one=allocs[0][0] if single else None,
            # A buffer like no input and no template: ``Tensor.new_empty`` on the call's first
            # tensor (on the device the key fixed), cheaper than ``torch.empty(..., device=)``.
            empty=torch.Tensor.new_empty, empty_like=torch.empty_like, source=positions[0],
            index=index, get_device=_direct.current_device_getter(get_device),
            get_stream=get_stream, consts=consts, fn=launchers[0][0], pick=launchers[0][1],
            args=launchers[0][2], more=tuple(launchers[1:]),
            results=None if every else plan.results, positions=positions,
            launches=tuple((direct, spec) for (spec, _), direct in zip(blocks, directs,
                                                                        strict=True)),
            quiet=quiet, pre_run_hooks=hooks, more_hooks=more_hooks, scratch=scratch,
            capturing=capture_probe(), u8=torch.uint8, zeroed=bool(form.zeroed),
        )  # fmt: skip

    def launch(self, args: tuple[Any, ...], ptrs: list[int | None]) -> tuple[Any, ...] | None:
        """The result buffers, launched; None where the ordinary path must run (another
        current device, a Triton hook or pre-run hook). `ptrs`: the call's tensors'
        addresses."""
        # DirectLaunch.usable, inline (one Python call fewer per launch).
        if self._get_device() != self._index or not self._quiet() or self._pre_run_hooks:
            return None
        src = self._consts + ptrs
        like = self._one
        if like is not None:  # one output allocated like an input: most forwards
            y = self._empty_like(args[like])
            p = y.data_ptr()
            if p & ALIGN_MASK:  # another specialization: the direct launcher picks it
                return self._by_direct(args, [y])
            src.append(p)
            src.append(self._get_stream(self._index))
            if self._args is None:
                self._fn(*self._pick(src))
            else:
                self._fn(*self._pick(src), self._args(src))
            if _recorded.get(self._op) != self._impl:  # observe.record, called on a change only
                record(self._op, self._impl, self._arch)
            return (y,)
        if self._more_hooks and any(self._more_hooks):  # another kernel's pre-run hook
            return None
        empty, empty_like, source = self._empty, self._empty_like, args[self._source]
        stream = self._get_stream(self._index)
        base = None
        if self._scratch:
            if not self._capturing():
                arena = _ARENAS.get((self._index, stream, _thread()))
                if arena is None or arena[0] < self._scratch:
                    arena = _grow_arena(source, self._index, stream, self._scratch, self._u8)
                base = arena[1]
            elif self._zeroed:  # no arena in a graph: the ordinary path zeroes the buffer
                return None
        bufs = []
        for like, shape, dtype, template, at, _ in self._allocs:
            if at is not None and base is not None:  # scratch: the arena's, at its offset
                src.append(base + at)
                bufs.append(None)
                continue
            b = (
                empty_like(args[like]) if like is not None
                else empty_like(template) if template is not None
                else empty(source, shape, dtype=dtype)
            )  # fmt: skip
            p = b.data_ptr()
            if p & ALIGN_MASK:  # another specialization: the direct launcher picks it
                return self._by_direct(args, self._fresh(args))
            src.append(p)
            bufs.append(b)
        src.append(stream)
        if self._args is None:
            self._fn(*self._pick(src))
        else:
            self._fn(*self._pick(src), self._args(src))
        for fn, pick, rest in self._more:
            if rest is None:
                fn(*pick(src))
            else:
                fn(*pick(src), rest(src))
        if _recorded.get(self._op) != self._impl:  # observe.record, called on a change only
            record(self._op, self._impl, self._arch)
        results = self._results
        return tuple(bufs) if results is None else tuple([bufs[i] for i in results])

    def _fresh(self, args: tuple[Any, ...]) -> list[Any]:
        """Every buffer of the plan freshly allocated, scratch included (the direct
        launcher's path takes tensors)."""
        source = args[self._source]
        return [
            source.new_zeros(shape, dtype=dtype) if zeroed
            else self._empty_like(args[like]) if like is not None
            else self._empty_like(template) if template is not None
            else self._empty(source, shape, dtype=dtype)
            for like, shape, dtype, template, _, zeroed in self._allocs
        ]  # fmt: skip

    def _by_direct(self, args: tuple[Any, ...], bufs: list[Any]) -> tuple[Any, ...]:
        positions = self._positions
        for direct, spec in self._launches:
            direct([args[positions[v]] if k == _IN else bufs[v] if k == _OUT else v
                    for k, v in spec])  # fmt: skip
        record(self._op, self._impl, self._arch)
        results = self._results
        return tuple(bufs) if results is None else tuple([bufs[i] for i in results])


# (device index, stream handle, thread) -> (bytes, address, the arena tensor): see
# scratch_arena.
_ARENAS: dict[tuple[int, int, int], tuple[int, int, Any]] = {}
_thread = threading.get_ident
# Offsets of scratch buffers in an arena are multiples of this (Triton's 16-byte
# specialization holds, and cache lines are not shared between buffers).
_ARENA_ALIGN = 256
# A plan whose scratch is larger allocates it per call, as any buffer (a bound on what an
# arena holds on to; and ROCm's buffer-ops attribute stays that of a small storage).
ARENA_LIMIT = 64 * 2**20
# The arena's first bytes: zeroed when it is made, then left zero by every kernel (zeroed
# scratch buffers, ``_TorchForm.zeroed``); scratch buffers start after them.
ARENA_HEADER = 1024


def _arena_offsets(
    plain: list[tuple[tuple[int, ...], Any]], results: tuple[int, ...], zeroed: tuple[int, ...]
) -> tuple[list[int | None], int] | None:
    """(where each buffer of a plan lies in the scratch arena, None for a result or scratch
    allocated per call; the bytes the arena needs, 0 for none), or None where a zeroed
    buffer cannot come from the arena's header (more than it holds, or scratch over
    ``ARENA_LIMIT``, allocated per call): the plan then takes the ordinary path."""
    at: list[int | None] = []
    scratch, header = ARENA_HEADER, 0
    for i, (shape, dtype) in enumerate(plain):
        nbytes = -(-math.prod(shape) * dtype.itemsize // _ARENA_ALIGN) * _ARENA_ALIGN
        if i in results:
            at.append(None)
        elif i in zeroed:
            at.append(header)
            header += nbytes
        else:
            at.append(scratch)
            scratch += nbytes
    if header > ARENA_HEADER or (zeroed and scratch > ARENA_LIMIT):
        return None
    if scratch > ARENA_LIMIT:
        return [None] * len(plain), 0
    return at, (scratch if any(a is not None for a in at) else 0)


def scratch_arena(device: int, stream: int, thread: int | None = None) -> Any | None:
    """The scratch arena of `stream` (a handle) on `device` for `thread` (an ident; the
    calling thread's by default), or None: one uint8 tensor that ready launches from that
    thread on that stream carve their scratch buffers from (a norm backward's fp32
    partials), instead of allocating them per call.

    Safe because scratch never outlives its call and a stream runs its kernels in order: a
    call's kernels finish reading its scratch before the next call's kernels on the same
    stream write it, the order the caching allocator itself relies on when it hands a freed
    block to the next allocation on that stream. Arenas are per stream, so work on two
    streams never shares one. Not used while the stream is being captured into a CUDA
    graph (graphs replay on any stream, at any time: a captured launch allocates as
    before). An arena grows to the largest scratch asked of it (at most ``ARENA_LIMIT``)
    and is held until :func:`release_scratch`; ``torch.cuda.empty_cache`` does not free it.
    Its first ``ARENA_HEADER`` bytes are zeroed when it is made (one memset, queued on
    `stream` before any kernel that reads them) and hold zeroed scratch (counters that
    their kernels leave zero); the other scratch buffers start after them.
    """
    arena = _ARENAS.get((device, stream, _thread() if thread is None else thread))
    return None if arena is None else arena[2]


def release_scratch() -> None:
    """Drop every scratch arena (the caching allocator gets their memory back)."""
    _ARENAS.clear()


def _grow_arena(
    source: Any, device: int, stream: int, nbytes: int, u8: Any
) -> tuple[int, int, Any]:
    # Allocated on the current stream (`stream`): once dropped, the caching allocator reuses
    # it only after this stream's queued kernels, the ones that read the old arena.
    size = -(-nbytes // 2**16) * 2**16
    # Threads that ended keep no arena: they are dropped here, when an arena is made (a new
    # thread's first call makes one), so arenas never outnumber live threads' by more than one.
    # list(): one copy under the GIL (another thread may add its arena meanwhile).
    alive = {t.ident for t in threading.enumerate()}
    for key in [k for k in list(_ARENAS) if k[2] not in alive]:
        _ARENAS.pop(key, None)
    tensor = source.new_empty((size,), dtype=u8)
    tensor[:ARENA_HEADER].zero_()
    arena = (size, tensor.data_ptr(), tensor)
    _ARENAS[(device, stream, _thread())] = arena
    return arena


@functools.cache
def capture_probe() -> Callable[[], bool]:
    """Whether the current stream is capturing a CUDA graph: torch's C probe (no Python
    frame of ``torch.cuda.is_current_stream_capturing`` per call), or a constant False
    where torch has no CUDA (a CPU build: nothing can capture)."""
    import torch

    probe = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)
    try:
        probe()  # type: ignore[misc]
    except Exception:  # a CPU build's stand-in raises: no graph can be captured
        return bool
    return probe  # type: ignore[return-value]


def _template(device_tensor: Any, shape: tuple[int, ...], dtype: Any) -> Any | None:
    """A zero-stride tensor of `shape` and `dtype` over one element on `device_tensor`'s
    device, that ``torch.empty_like`` allocates contiguous buffers like: it parses one
    tensor where ``Tensor.new_empty`` parses a shape and a dtype (a norm forward's saved
    statistics, which are like no input). None where a dim is 0 or 1 (there empty_like
    would keep the template's zero stride) or empty_like does not give a contiguous
    buffer."""
    import torch

    if not shape or min(shape) < 2:
        return None
    template = device_tensor.new_empty((), dtype=dtype).expand(shape)
    probe = torch.empty_like(template)
    return template if probe.is_contiguous() and probe.dtype == dtype else None


def _like(
    inputs: tuple[Any, ...], positions: tuple[int, ...], shape: tuple[int, ...], dtype: Any
) -> int | None:
    """The call argument a buffer may be allocated like (``torch.empty_like`` parses one
    tensor where ``torch.empty`` parses a shape, a dtype and a device: a cheaper call):
    a contiguous input of the buffer's shape and dtype. The signature key fixes shapes,
    dtypes and strides, so what holds for this call holds for every call of the launch."""
    for tensor, position in zip(inputs, positions, strict=True):
        if tensor is None:  # an absent optional tensor
            continue
        if tuple(tensor.shape) == shape and tensor.dtype == dtype and tensor.is_contiguous():
            return position
    return None


def eager_raw(*tensors: Any) -> bool:
    """True when a GRETA op may launch its plan directly instead of going through torch.ops.

    torch.library's custom-op dispatch costs tens of microseconds of host time per call (a
    launch-bound decode step pays it on every op). It buys autograd, tracing and dispatch
    modes; when none of them can be involved (plain GPU tensors, no gradient wanted, no
    torch.compile tracing, no torch function/dispatch mode active) the raw launcher runs the
    same kernel with the same checks. Anything else, or a torch without these hooks, takes
    the torch op.
    """
    probes = _PROBES or _eager_probes()
    if probes is None:
        return False
    compiling, dispatch_modes, function_modes, grad_enabled, plain, _ = probes
    if compiling() or dispatch_modes() or function_modes():
        return False
    grad = grad_enabled()
    for t in tensors:
        if t is None:
            continue
        # is_cuda: CUDA and ROCm tensors (cheaper than building t.device.type).
        if type(t) not in plain or not t.is_cuda or (grad and t.requires_grad):
            return False
    return True


def eager_training(tensors: tuple[Any, ...]) -> bool | None:
    """How a torch.ops front runs a call, told in one pass over its tensors. None: autograd
    does not record it (grad mode off, or no tensor requires a gradient), so the no-grad
    path decides (:meth:`ForwardCall.if_eager`). True: it does, and GRETA's plans may run
    under a plain ``torch.autograd.Function`` instead of the torch op's autograd (plain GPU
    tensors, no dispatch or function mode, no functorch transform: its wrapped tensors need
    the torch op's rules). False: it does, and the torch op must run.

    torch.library's autograd wrapper (argument flattening, a generated Function per call,
    the custom-op dispatch forward and backward) costs about a millisecond of host time per
    training step of one attention call on an H100 host, more than the kernels run at
    S=2048 (bench/attention_sweep.py's host column).

    No compiling() probe, as in :meth:`CallCache.launch_args`: the fronts run under the
    dispatcher, and the Python entries that skip it (``greta_core.torch.ops``) ask first.
    """
    probes = _PROBES or _eager_probes()
    if probes is None:  # the no-grad path declines too: the torch op, autograd and all
        return None
    _, dispatch_modes, function_modes, grad_enabled, plain, functorch_active = probes
    if not grad_enabled():
        return None
    wants_grad, eager = False, True
    for t in tensors:
        if t is not None:
            wants_grad = wants_grad or t.requires_grad
            # is_cuda: CUDA and ROCm tensors (cheaper than building t.device.type).
            eager = eager and type(t) in plain and t.is_cuda
    if not wants_grad:
        return None
    return eager and not (dispatch_modes() or function_modes() or functorch_active())


# torch's checks that eager_raw runs on every call, looked up once (a hot path). A module
# global, not functools.cache: dynamo, tracing a caller, warns about lru_cache wrappers.
_PROBES: tuple[Any, ...] | None = None


def _eager_probes() -> tuple[Any, ...] | None:
    global _PROBES
    import torch

    try:
        _PROBES = (
            torch.compiler.is_compiling,
            torch._C._len_torch_dispatch_stack,
            torch._C._len_torch_function_stack,
            torch.is_grad_enabled,
            # Plain tensors only: subclasses (FakeTensor, DTensor...) take the torch op.
            (torch.Tensor, torch.nn.Parameter),
            # Without this probe, no eager training path (eager_raw needs none).
            getattr(torch._C, "_are_functorch_transforms_active", lambda: True),
        )
    except AttributeError:  # a torch without these hooks: every call takes the torch op
        return None
    return _PROBES
