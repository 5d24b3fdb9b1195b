"""The torch executor's direct launcher (ops/_direct.py): Triton's own path on the first
call of a specialization, the compiled kernel launched directly afterwards.

On the CPU: the key, the binding of the kernel's trailing parameters, the convention check
against the installed Triton, the fallbacks and the bound, through stand-ins for Triton's
kernel, compiled kernel and driver. On the GPU: bit-identical results to Triton's own path
for aligned and misaligned inputs, the current stream (a CUDA graph captures the launch),
each device, and launch hooks honoured.
"""

from __future__ import annotations

import threading
import types
from dataclasses import dataclass
from typing import Any

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

from _kernel_testing import PassthroughMode, cuda_stand_in  # noqa: E402

from greta_core import observe  # noqa: E402
from greta_core.ops import _direct, _plan  # noqa: E402
from greta_core.ops._plan import Buffer, In, Launch, Out, Plan  # noqa: E402
from greta_install import triton_range  # noqa: E402

_IN, _OUT, _SCALAR = _plan._IN, _plan._OUT, _plan._SCALAR


# --- stand-ins for Triton's objects ------------------------------------------------------


# GRETA's kernels in training too (the tables hand small norm/softmax training calls to torch).
pytestmark = pytest.mark.usefixtures("greta_training")


class _Chain:
    def __init__(self) -> None:
        self.calls: list[Any] = []


class _Compiled:
    def __init__(self) -> None:
        self.function = "function-handle"
        self.packed_metadata = "packed"
        self.launches: list[tuple[Any, ...]] = []

    @property
    def run(self) -> Any:
        return lambda *a: self.launches.append(a)


class _Param:
    def __init__(self, name: str, default: Any = None, has_default: bool = False) -> None:
        self.name, self.default, self.has_default = name, default, has_default


class _Kernel:
    """Triton's JITFunction as the launcher sees it: kernel[grid](...) returns the compiled
    kernel (Triton's own path), params name the signature."""

    def __init__(self, returns: Any = "compiled") -> None:
        self.params = [_Param(n) for n in ("x", "n", "y", "BLOCK")] + [_Param("FLAG", 7, True)]
        self.pre_run_hooks: list[Any] = []
        self.compiled = _Compiled()
        self.returns = self.compiled if returns == "compiled" else returns
        self.triton_path: list[tuple[Any, ...]] = []

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        def launch(*args: Any, **kw: Any) -> Any:
            self.triton_path.append((grid, args, kw))
            return self.returns

        return launch


def _support(**runtime: Any) -> _direct.Support:
    knobs = types.SimpleNamespace(
        runtime=types.SimpleNamespace(
            **{
                "launch_enter_hook": _Chain(),
                "launch_exit_hook": _Chain(),
                "debug": False,
                **runtime,
            }
        ),
        compilation=types.SimpleNamespace(instrumentation_mode=""),
    )
    return _direct.Support(_Kernel, _Compiled, _Chain, knobs, hip=False)


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Triton's current-device / current-stream getters, with the device settable."""
    current = {"device": 0}
    getters = (lambda: current["device"], lambda d: 1000 + d)
    monkeypatch.setattr(_direct, "_driver", lambda: getters)
    return current


def _launch(kernel: _Kernel, s: _direct.Support) -> _direct.DirectLaunch:
    spec = ((_IN, 0), (_SCALAR, 64), (_OUT, 0))
    made = _direct.direct_launch(kernel, (3, 2), spec, {"BLOCK": 16, "num_warps": 4}, (_IN, _OUT))
    assert made is None  # the stand-in is no JITFunction of the installed Triton ...
    tail = _direct.bind_tail(kernel.params, 3, {"BLOCK": 16, "num_warps": 4})
    assert tail == (16, 7)  # keyword, then default; options (num_warps) are no parameter
    return _direct.DirectLaunch(kernel, (3, 2), {"BLOCK": 16, "num_warps": 4}, (0, 2), tail, s)


def _args(x: Any) -> list[Any]:
    return [x, 64, torch.empty(4)]


# --- CPU: the pure parts -------------------------------------------------------------------


def test_first_call_takes_tritons_path_then_the_compiled_kernel_directly(device) -> None:
    kernel = _Kernel()
    launch = _launch(kernel, _support())
    args = _args(torch.ones(4))
    for _ in range(3):
        launch(args)
    assert kernel.triton_path == [((3, 2), tuple(args), {"BLOCK": 16, "num_warps": 4})]
    # CompiledKernel.run's arguments: grid padded to 3-D, the device's stream, the handle,
    # packed metadata, no launch metadata and no hooks, then every kernel parameter.
    want = (3, 2, 1, 1000, "function-handle", "packed", None, None, None, *args, 16, 7)
    assert kernel.compiled.launches == [want, want]


def test_key_follows_alignment_dtype_and_device(device) -> None:
    kernel = _Kernel()
    launch = _launch(kernel, _support())
    base = torch.zeros(17)
    launch(_args(base[:16]))
    launch(_args(base[1:]))  # 4 bytes off: Triton specializes pointers on 16-byte alignment
    launch(_args(base[:16].half()))
    device["device"] = 1
    launch(_args(base[:16]))
    assert len(kernel.triton_path) == 4 and kernel.compiled.launches == []
    launch(_args(base[:16]))
    device["device"] = 0
    launch(_args(base[4:]))  # 16 bytes off: aligned like base[:16]
    assert [a[3] for a in kernel.compiled.launches] == [1001, 1000]  # each device's stream
    assert len(kernel.triton_path) == 4


def test_tensor_key_rules() -> None:
    base = torch.zeros(40)
    aligned, off = base[:8], base[1:9]
    assert _direct.tensor_key([aligned, 3, off], (0, 2), hip=False) == (
        (torch.float32, True),
        (torch.float32, False),
    )
    assert _direct.tensor_key([None], (0,), hip=False) == (None,)
    # ROCm: the buffer-ops attribute (storage within 2 GiB) joins the key.
    assert _direct.tensor_key([aligned], (0,), hip=True) == ((torch.float32, True, True),)


@pytest.mark.parametrize(
    "setting",
    ["enter_hook", "exit_hook", "plain_hook", "debug", "instrumentation", "pre_run_hook"],
)
def test_anything_unusual_takes_tritons_path_every_call(device, setting: str) -> None:
    kernel = _Kernel()
    s = _support()
    if setting in ("enter_hook", "exit_hook"):
        getattr(s.knobs.runtime, f"launch_{setting}").calls.append(print)
    elif setting == "plain_hook":  # Triton before HookChain: a callable set directly
        s.knobs.runtime.launch_enter_hook = print
    elif setting == "debug":
        s.knobs.runtime.debug = True
    elif setting == "instrumentation":
        s.knobs.compilation.instrumentation_mode = "consan"
    else:
        kernel.pre_run_hooks.append(print)
    launch = _launch(kernel, s)
    for _ in range(3):
        launch(_args(torch.ones(4)))
    assert len(kernel.triton_path) == 3 and kernel.compiled.launches == []


def test_a_result_that_is_no_compiled_kernel_keeps_tritons_path(device) -> None:
    kernel = _Kernel(returns=None)  # e.g. a Triton whose run returns nothing
    launch = _launch(kernel, _support())
    for _ in range(3):
        launch(_args(torch.ones(4)))
    assert len(kernel.triton_path) == 3 and launch.entries == {}


def test_cache_is_bounded(device) -> None:
    kernel = _Kernel()
    launch = _launch(kernel, _support())
    for d in range(_direct.MAX_ENTRIES + 5):
        device["device"] = d
        launch(_args(torch.ones(4)))
        assert len(launch.entries) <= _direct.MAX_ENTRIES
    assert len(kernel.triton_path) == _direct.MAX_ENTRIES + 5


def test_support_follows_the_supported_triton_range() -> None:
    # Which Triton the fast path serves is greta_install.triton_range's decision
    # (tests/test_triton_range.py checks each version's adapter against Triton's own).
    convention = triton_range.launch_convention(triton.__version__)
    support = _direct.support()
    assert (support is None) == (convention is None)
    if support is not None:
        assert support.convention == convention


def test_direct_launch_binds_a_greta_kernel() -> None:
    support = _direct.support()
    if support is None:  # a Triton outside the supported range: off, and said so
        assert triton_range.fast_launch_off_reason(triton.__version__) is not None
        assert "not supported" in (observe.last_implementation("fast_launch") or "")
        return
    from triton.runtime.jit import JITFunction

    from greta_core.kernels.rms_norm import rms_norm_fwd_kernel

    # Under TRITON_INTERPRET=1 (the CPU suite) kernels are InterpretedFunctions: they keep
    # Triton's path. A JITFunction of the same source is what a GPU process holds.
    fn = getattr(rms_norm_fwd_kernel, "fn", rms_norm_fwd_kernel)
    jit = rms_norm_fwd_kernel if type(rms_norm_fwd_kernel) is JITFunction else JITFunction(fn)
    spec = ((_IN, 0), (_IN, 1), (_SCALAR, 64), (_SCALAR, 64), (_SCALAR, 1e-6),
            (_OUT, 0), (_OUT, 1))  # fmt: skip
    keywords = {"BLOCK_N": 64, "ONE_PASS": True, "STORE_RSTD": True, "num_warps": 4}
    launch = _direct.direct_launch(jit, (4,), spec, keywords, (_IN, _OUT))
    assert isinstance(launch, _direct.DirectLaunch)
    assert launch._slots == (0, 1, 5, 6) and launch._tail == (64, True, True)
    assert _direct.direct_launch(jit, (4,), spec, {"BLOCK_N": 64}, (_IN, _OUT)) is None
    if type(rms_norm_fwd_kernel) is not JITFunction:
        assert _direct.direct_launch(rms_norm_fwd_kernel, (4,), spec, keywords, (_IN, _OUT)) is None


def test_executor_routes_launches_through_the_direct_launcher(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    direct_calls: list[list[Any]] = []
    wrapped: list[Any] = []

    def fake_direct_launch(kernel, grid, spec, keywords, kinds):
        return direct_calls.append

    class Kernel:
        def __getitem__(self, grid):
            return lambda *a, **kw: wrapped.append(a)

    def wrap(kernel: Any) -> Any:
        return kernel

    monkeypatch.setattr(_direct, "direct_launch", fake_direct_launch)
    x = torch.ones(3)

    def plan(arch: str) -> Plan:
        return Plan("fake", arch, (Buffer((3,), "float32"),),
                    (Launch(Kernel(), (1,), (In(0), 2, Out(0)), {"B": 1}),), (0,))  # fmt: skip

    gpu_plan, cpu_plan = plan("sm_90"), plan("cpu")
    _plan.run(gpu_plan, (x,))
    assert len(direct_calls) == 1 and direct_calls[0][:2] == [x, 2] and wrapped == []
    _plan.run(cpu_plan, (x,))  # the interpreter keeps Triton's path
    assert len(direct_calls) == 1 and len(wrapped) == 1
    monkeypatch.setattr(_plan, "_wrap_triton_enabled", lambda: True)  # torch is tracing
    _plan.run(gpu_plan, (x,), wrap=wrap)
    assert len(direct_calls) == 1 and len(wrapped) == 2
    monkeypatch.setattr(_plan, "_wrap_triton_enabled", lambda: False)  # a triton_op's kernel
    _plan.run(gpu_plan, (x,), wrap=wrap)
    assert len(direct_calls) == 2 and len(wrapped) == 2


# --- CPU: Triton's CUDA launcher called without its wrapper ---------------------------------


# --- CPU: the ready launch of a call signature (ops/_calls.py) ---------------------------


@pytest.fixture
def ready_setup(monkeypatch: pytest.MonkeyPatch, device: dict[str, int]) -> Any:
    """A CallCache over a one-launch plan whose kernel is the stand-in above."""
    from greta_core.ops import _calls

    kernel, s = _Kernel(), _support()

    def fake_direct_launch(k, grid, spec, keywords, kinds):  # type: ignore[no-untyped-def]
        slots = tuple(i for i, (kind, _) in enumerate(spec) if kind in kinds)
        return _direct.DirectLaunch(k, grid, keywords, slots, (16, 7), s)

    monkeypatch.setattr(_direct, "direct_launch", fake_direct_launch)
    plan = Plan("fake", "sm_90", (Buffer((4,), "float32"),),
                (Launch(kernel, (3, 2), (In(0), 64, Out(0)), {"BLOCK": 16}),), (0,))  # fmt: skip
    resolved: list[Any] = []

    def resolve(x: Any) -> Plan:
        resolved.append(x)
        return plan

    cache = _calls.CallCache(resolve, n_tensors=1, plan_inputs=lambda p: (p, (0,)))
    return types.SimpleNamespace(cache=cache, kernel=kernel, support=s, resolved=resolved)


def test_ready_launch_after_triton_compiled_and_the_direct_launcher_captured(ready_setup) -> None:
    cache, kernel = ready_setup.cache, ready_setup.kernel
    x = torch.ones(4)
    (y1,) = cache.launch_args(
        _plan._identity, False, (x,)
    )  # Triton's path compiles; the kernel is captured
    assert len(kernel.triton_path) == 1 and kernel.compiled.launches == []
    (y2,) = cache.launch_args(_plan._identity, False, (x,))  # the ready launch
    (y3,) = cache.launch_args(_plan._identity, False, (x,))
    assert len(kernel.triton_path) == 1 and len(ready_setup.resolved) == 1
    # CompiledKernel.run's arguments (as the direct launcher passes them), the pointers as
    # integers (Triton's launcher takes both), fresh buffers on each call.
    head = (3, 2, 1, 1000, "function-handle", "packed", None, None, None)
    assert kernel.compiled.launches == [
        (*head, x.data_ptr(), 64, y2.data_ptr(), 16, 7),
        (*head, x.data_ptr(), 64, y3.data_ptr(), 16, 7),
    ]
    assert y2 is not y3
    assert y3.shape == (4,) and y3.dtype == torch.float32 and y1.shape == (4,)


def test_ready_launch_keys_on_alignment_and_checks_the_device(ready_setup, device) -> None:
    cache, kernel = ready_setup.cache, ready_setup.kernel
    base = torch.zeros(8)
    aligned, misaligned = base[:4], base[1:5]
    for _ in range(3):
        cache.launch_args(_plan._identity, False, (aligned,))
    assert len(kernel.triton_path) == 1
    cache.launch_args(
        _plan._identity, False, (misaligned,)
    )  # another specialization: Triton's path
    cache.launch_args(_plan._identity, False, (misaligned,))
    assert len(kernel.triton_path) == 2
    assert sorted(k[-1] for k in cache._ready) == [False, True]  # the alignment bit
    assert kernel.compiled.launches[-1][9] == misaligned.data_ptr()
    n = len(kernel.compiled.launches)
    device["device"] = 1  # another current device: the ready launch declines
    assert cache.launch_args(_plan._identity, False, (aligned,)) is None
    assert len(kernel.compiled.launches) == n


def test_ready_launch_declines_while_anything_unusual_is_set(ready_setup) -> None:
    cache, kernel, s = ready_setup.cache, ready_setup.kernel, ready_setup.support
    x = torch.ones(4)
    for _ in range(3):
        cache.launch_args(_plan._identity, False, (x,))
    n = len(kernel.compiled.launches)
    s.knobs.runtime.launch_enter_hook.calls.append(print)
    assert (
        cache.launch_args(_plan._identity, False, (x,)) is None
    )  # the caller's ordinary path honours it
    assert len(kernel.compiled.launches) == n
    s.knobs.runtime.launch_enter_hook.calls.clear()
    kernel.pre_run_hooks.append(print)
    assert cache.launch_args(_plan._identity, False, (x,)) is None
    kernel.pre_run_hooks.clear()
    assert cache.launch_args(_plan._identity, False, (x,)) is not None
    assert len(kernel.compiled.launches) == n + 1


def test_ready_launch_not_while_torch_traces(ready_setup, monkeypatch: pytest.MonkeyPatch) -> None:
    from greta_core.ops import _calls

    def wrap(kernel: Any) -> Any:
        return kernel

    monkeypatch.setattr(_calls, "_wrap_triton_enabled", lambda: True)
    assert ready_setup.cache.launch_args(wrap, False, (torch.ones(4),)) is None
    assert ready_setup.kernel.triton_path == [] and ready_setup.resolved == []
    monkeypatch.setattr(_calls, "_wrap_triton_enabled", lambda: False)  # a triton_op's kernel
    assert ready_setup.cache.launch_args(wrap, False, (torch.ones(4),)) is not None


def test_plans_that_do_not_fit_take_the_ordinary_path(
    monkeypatch: pytest.MonkeyPatch, ready_setup
) -> None:
    from greta_core.ops import _calls

    kernel = ready_setup.kernel
    zeroed = Plan("fake", "sm_90", (Buffer((4,), "float32", zeroed=True),),
                  (Launch(kernel, (1,), (In(0), 64, Out(0)), {"BLOCK": 16}),), (0,))  # fmt: skip
    interpreted = Plan("fake", "cpu", (Buffer((4,), "float32"),),
                       (Launch(kernel, (1,), (In(0), 64, Out(0)), {"BLOCK": 16}),), (0,))  # fmt: skip
    for plan in (zeroed, interpreted):
        cache = _calls.CallCache(lambda x, p=plan: p, 1, plan_inputs=lambda p: (p, (0,)))
        assert cache.launch_args(_plan._identity, False, (torch.ones(4),)) is None
        assert list(cache._ready.values()) == [_calls._ORDINARY]
    copies = _calls.CallCache(lambda x: (zeroed, True), 1, plan_inputs=lambda r: None)
    assert copies.launch_args(_plan._identity, False, (torch.ones(4),)) is None
    assert list(copies._ready.values()) == [_calls._ORDINARY]


def _scratch_plan(monkeypatch: pytest.MonkeyPatch, a: Any, b: Any, s: Any) -> tuple[Plan, Any]:
    """A backward's shape: kernel `a` writes fp32 partials (scratch) from the input, `b`
    reduces them into the result; direct launches made with support `s`. (plan, its call
    cache.)"""
    from greta_core.ops import _calls

    def fake_direct_launch(k, grid, spec, keywords, kinds):  # type: ignore[no-untyped-def]
        slots = tuple(i for i, (kind, _) in enumerate(spec) if kind in kinds)
        return _direct.DirectLaunch(k, grid, keywords, slots, (keywords["BLOCK"], 7), s)

    monkeypatch.setattr(_direct, "direct_launch", fake_direct_launch)
    plan = Plan("fake", "sm_90", (Buffer((4,), "bfloat16"), Buffer((8, 4), "float32")),
                (Launch(a, (8,), (In(0), 4, Out(1)), {"BLOCK": 16}),
                 Launch(b, (2, 3), (Out(1), 8, Out(0)), {"BLOCK": 32})), (0,))  # fmt: skip
    return plan, _calls.CallCache(lambda x: plan, 1, plan_inputs=lambda p: (p, (0,)))


def test_ready_launch_runs_every_launch_of_a_plan_with_scratch(
    monkeypatch: pytest.MonkeyPatch, device
) -> None:
    """A backward's shape: kernel A writes fp32 partials (a scratch buffer, not a result)
    from the input, kernel B reduces them into the result. Both run ready, in order, each
    with its own grid, scalars and trailing parameters, the scratch pointer in both."""
    from greta_core.ops import _calls

    a, b, s = _Kernel(), _Kernel(), _support()
    _, cache = _scratch_plan(monkeypatch, a, b, s)
    x = torch.ones(4)
    (_y0,) = cache.launch_args(_plan._identity, False, (x,))  # Triton's path for both
    assert len(a.triton_path) == len(b.triton_path) == 1
    (ready,) = cache._ready.values()
    assert type(ready) is _calls.ReadyLaunch
    for _ in range(2):
        (y,) = cache.launch_args(_plan._identity, False, (x,))
        assert (y.shape, y.dtype) == ((4,), torch.bfloat16)
        (la,), (lb,) = a.compiled.launches[-1:], b.compiled.launches[-1:]
        tail = ("function-handle", "packed", None, None, None)
        partials = la[11]  # kernel A's output pointer: the scratch buffer
        assert la == (8, 1, 1, 1000, *tail, x.data_ptr(), 4, partials, 16, 7)
        assert lb == (2, 3, 1, 1000, *tail, partials, 8, y.data_ptr(), 32, 7)
        assert partials not in (x.data_ptr(), y.data_ptr())
    assert len(a.triton_path) == len(b.triton_path) == 1
    assert len(a.compiled.launches) == len(b.compiled.launches) == 2
    b.pre_run_hooks.append(lambda *args: None)  # any kernel's hook: Triton's path again
    assert cache.launch_args(_plan._identity, False, (x,)) is None


def test_ready_launch_carves_scratch_from_the_streams_arena(
    monkeypatch: pytest.MonkeyPatch, device
) -> None:
    """A plan's scratch buffer (the partials) is no allocation per call on the ready path:
    every call on one stream gets the same arena address; another stream gets its own
    arena; while the stream captures a CUDA graph, and for scratch over ARENA_LIMIT, the
    scratch is allocated per call as before."""
    from greta_core.ops import _calls

    monkeypatch.setattr(_calls, "_ARENAS", {})
    a, b, s = _Kernel(), _Kernel(), _support()
    _, cache = _scratch_plan(monkeypatch, a, b, s)
    x = torch.ones(4)
    cache.launch_args(_plan._identity, False, (x,))  # Triton's path: a fresh scratch
    assert _calls.scratch_arena(0, 1000) is None
    (ready,) = cache._ready.values()
    made: list[Any] = []
    real_empty, real_empty_like = ready._empty, ready._empty_like

    def empty(source: Any, shape: Any, dtype: Any) -> Any:
        made.append((tuple(shape), dtype))
        return real_empty(source, shape, dtype=dtype)

    def empty_like(like: Any) -> Any:
        made.append((tuple(like.shape), like.dtype))
        return real_empty_like(like)

    ready._empty, ready._empty_like = empty, empty_like

    def partials() -> int:
        cache.launch_args(_plan._identity, False, (x,))
        (la,), (lb,) = a.compiled.launches[-1:], b.compiled.launches[-1:]
        assert la[11] == lb[9]  # kernel A's output, kernel B's input
        return la[11]

    assert ready._allocs[0][3] is not None  # the result: empty_like of a template
    first = [partials(), partials()]
    arena = _calls.scratch_arena(0, 1000)
    assert arena is not None and arena.dtype == torch.uint8 and arena.numel() >= 8 * 4 * 4
    assert first == [arena.data_ptr() + _calls.ARENA_HEADER] * 2  # after the zeroed header
    assert not arena[: _calls.ARENA_HEADER].any()
    result = ((4,), torch.bfloat16)  # the result
    assert made == [result, result]  # no partials allocated per call
    made.clear()
    ready._get_stream = lambda d: 2000 + d  # another stream
    assert partials() == _calls.scratch_arena(0, 2000).data_ptr() + _calls.ARENA_HEADER
    assert _calls.scratch_arena(0, 2000).data_ptr() != arena.data_ptr()
    assert made == [result]
    made.clear()
    # Another thread on the first stream: its own arena (two threads' launches may
    # interleave on one stream).
    ready._get_stream = lambda d: 1000 + d
    other: list[int] = []
    worker = threading.Thread(target=lambda: other.append(partials()))
    worker.start()
    worker.join()
    theirs = _calls.scratch_arena(0, 1000, worker.ident)
    assert other and other[0] == theirs.data_ptr() + _calls.ARENA_HEADER
    assert theirs.data_ptr() != arena.data_ptr() and _calls.scratch_arena(0, 1000) is arena
    ready._get_stream = lambda d: 3000 + d  # a new arena: the ended thread's is dropped
    partials()
    assert _calls.scratch_arena(0, 1000, worker.ident) is None
    assert _calls.scratch_arena(0, 1000) is arena
    made.clear()
    ready._get_stream = lambda d: 2000 + d
    ready._capturing = lambda: True  # a CUDA graph being captured: fresh, as any buffer
    fresh = partials()
    assert made == [result, ((8, 4), torch.float32)]
    assert fresh not in (
        arena.data_ptr() + _calls.ARENA_HEADER,
        _calls.scratch_arena(0, 2000).data_ptr() + _calls.ARENA_HEADER,
    )
    _calls.release_scratch()
    assert _calls.scratch_arena(0, 1000) is None
    monkeypatch.setattr(_calls, "ARENA_LIMIT", 8 * 4 * 4 - 1)  # too large for an arena
    _, big_cache = _scratch_plan(monkeypatch, _Kernel(), _Kernel(), s)
    big_cache.launch_args(_plan._identity, False, (x,))
    (big_ready,) = big_cache._ready.values()
    assert big_ready._scratch == 0
    assert [alloc[4] for alloc in big_ready._allocs] == [None, None]


def test_ready_launch_takes_a_zeroed_counter_from_the_arenas_header(
    monkeypatch: pytest.MonkeyPatch, device
) -> None:
    """A zeroed scratch buffer (a norm backward's counter of finished programs) on the ready
    path: the start of the arena's header, zeroed once when the arena is made, no zeroing
    per call; the other scratch after the header. While a graph is captured the call takes
    the ordinary path (it allocates the counter zeroed); a plan whose zeroed buffer the
    header cannot hold, or a zeroed result, never gets a ready launch."""
    from greta_core.ops import _calls

    monkeypatch.setattr(_calls, "_ARENAS", {})
    a, b, s = _Kernel(), _Kernel(), _support()

    def fake_direct_launch(k, grid, spec, keywords, kinds):  # type: ignore[no-untyped-def]
        slots = tuple(i for i, (kind, _) in enumerate(spec) if kind in kinds)
        return _direct.DirectLaunch(k, grid, keywords, slots, (keywords["BLOCK"], 7), s)

    monkeypatch.setattr(_direct, "direct_launch", fake_direct_launch)
    buffers = (Buffer((4,), "bfloat16"), Buffer((8, 4), "float32"))
    launches = (Launch(a, (8,), (Out(2), 4, Out(1)), {"BLOCK": 16}),
                Launch(b, (2, 3), (Out(1), 8, Out(0)), {"BLOCK": 32}))  # fmt: skip
    plan = Plan("fake", "sm_90", (*buffers, Buffer((1,), "int32", zeroed=True)), launches, (0,))
    assert _calls.ReadyLaunch.fits(plan)
    zeroing: list[Any] = []
    real_zeros, real_zero_, real_new = torch.zeros, torch.Tensor.zero_, torch.Tensor.new_zeros

    def zeros(*args: Any, **kw: Any) -> Any:
        zeroing.append("zeros")
        return real_zeros(*args, **kw)

    def zero_(t: Any) -> Any:
        zeroing.append(t.numel())
        return real_zero_(t)

    def new_zeros(t: Any, *args: Any, **kw: Any) -> Any:
        zeroing.append("new_zeros")
        return real_new(t, *args, **kw)

    monkeypatch.setattr(torch, "zeros", zeros)
    monkeypatch.setattr(torch.Tensor, "zero_", zero_)
    monkeypatch.setattr(torch.Tensor, "new_zeros", new_zeros)
    cache = _calls.CallCache(lambda x: plan, 1, plan_inputs=lambda p: (p, (0,)))
    x = torch.ones(4)
    cache.launch_args(_plan._identity, False, (x,))  # the ordinary path: a zeroed counter
    assert zeroing == ["zeros"]
    (ready,) = cache._ready.values()
    assert type(ready) is _calls.ReadyLaunch
    for _ in range(3):
        (y,) = cache.launch_args(_plan._identity, False, (x,))
        (la,), (lb,) = a.compiled.launches[-1:], b.compiled.launches[-1:]
        arena = _calls.scratch_arena(0, 1000)
        assert la[9] == arena.data_ptr()  # the counter: the header's start
        assert la[11] == lb[9] == arena.data_ptr() + _calls.ARENA_HEADER  # the partials
        assert lb[11] == y.data_ptr()
    assert zeroing == ["zeros", _calls.ARENA_HEADER]  # the header, once, when made
    assert not arena[: _calls.ARENA_HEADER].any()
    launched = len(a.compiled.launches)
    ready._capturing = lambda: True  # no arena in a graph: the ordinary path
    assert cache.launch_args(_plan._identity, False, (x,)) is None
    assert len(a.compiled.launches) == launched
    ready._capturing = lambda: False
    fresh = ready._fresh((x,))  # the direct launcher's path (an unaligned buffer)
    assert fresh[2].dtype == torch.int32 and zeroing[-1] == "new_zeros" and fresh[2].item() == 0
    monkeypatch.setattr(_calls, "ARENA_HEADER", 255)  # too small for the counter's 256 bytes
    assert not _calls.ReadyLaunch.fits(plan)
    monkeypatch.setattr(_calls, "ARENA_HEADER", 1024)
    result = Plan("fake", "sm_90", (Buffer((4,), "bfloat16", zeroed=True), buffers[1]),
                  launches[1:], (0,))  # fmt: skip
    assert not _calls.ReadyLaunch.fits(result)  # a zeroed result: the ordinary path


def test_buffers_like_no_input_allocate_like_a_template() -> None:
    """A result like no input (a norm's fp32 statistics beside a bf16 input) is allocated by
    ``torch.empty_like`` of a one-element, zero-stride template: a contiguous buffer of its
    shape and dtype. No template where a dim is 0 or 1 (empty_like would keep a zero
    stride there): those take ``new_empty``."""
    from greta_core.ops import _calls

    x = torch.ones(4, 8, dtype=torch.bfloat16)
    template = _calls._template(x, (3, 5), torch.float32)
    assert template is not None and template.untyped_storage().nbytes() == 4
    buf = torch.empty_like(template)
    assert (buf.shape, buf.stride(), buf.dtype) == ((3, 5), (5, 1), torch.float32)
    assert buf.untyped_storage().nbytes() == 3 * 5 * 4
    for shape in [(1, 5), (5, 1), (0, 3), (1,), ()]:
        assert _calls._template(x, shape, torch.float32) is None


class _CudaLauncher:  # the name launch_form looks for; attributes as Triton's __init__ sets
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.global_scratch_size = self.profile_scratch_size = 0
        self.launch_cooperative_grid, self.launch_pdl = False, True
        self.arg_annotations, self.kernel_signature = ("annotation",), b"signature"
        self.launch = lambda *a: self.calls.append(a)

    def __call__(self, *args: Any) -> None:  # Triton's wrapper: never called here
        raise AssertionError("the wrapper ran")


_CudaLauncher.__name__ = "CudaLauncher"


class _LauncherCompiled(_Compiled):
    def __init__(self) -> None:
        super().__init__()
        self.launcher = _CudaLauncher()

    @property
    def run(self) -> Any:
        return self.launcher


@pytest.mark.parametrize("convention", ["flat", "packed"])
def test_ready_launch_hands_the_c_launcher_what_the_direct_launcher_does(
    monkeypatch: pytest.MonkeyPatch, device, convention: str
) -> None:
    """Triton's C launcher (launch_form skips its CudaLauncher wrapper): under the packed
    convention (Triton 3.7+) the ready launch calls it itself, the kernel's arguments as one
    tuple, without _direct._packed's frame. Each kernel of a plan with scratch gets the
    call the direct launcher makes through launch_form (pointers as integers)."""
    a, b = _Kernel(), _Kernel()
    for k in (a, b):
        k.compiled = k.returns = _LauncherCompiled()
    knobs = _support().knobs
    s = _direct.Support(_Kernel, _LauncherCompiled, _Chain, knobs, False, convention)

    plan, cache = _scratch_plan(monkeypatch, a, b, s)
    x = torch.ones(4)
    cache.launch_args(_plan._identity, False, (x,))  # Triton's path for both: captured
    (ready,) = cache._ready.values()
    (y,) = cache.launch_args(_plan._identity, False, (x,))
    (la,), (lb,) = a.compiled.launcher.calls, b.compiled.launcher.calls
    assert (ready._args is None) == (convention == "flat")
    partials = (la[-1] if convention == "packed" else la)[-3]
    scratch = torch.empty(8, 4)
    directs = [launch[4] for launch in _plan._torch_form(plan).launches]
    directs[0]([x, 4, scratch])
    directs[1]([scratch, 8, y])
    ptr = {scratch.data_ptr(): partials}

    def as_ready(call: tuple[Any, ...]) -> tuple[Any, ...]:  # tensors as the ready pointers
        return tuple(
            as_ready(v) if type(v) is tuple
            else ptr.get(v.data_ptr(), v.data_ptr()) if isinstance(v, torch.Tensor) else v
            for v in call
        )  # fmt: skip

    assert la == as_ready(a.compiled.launcher.calls[1])
    assert lb == as_ready(b.compiled.launcher.calls[1])
    if convention == "packed":
        assert la[-1] == (x.data_ptr(), 4, partials, 16, 7)
        assert lb[-1] == (partials, 8, y.data_ptr(), 32, 7)


def test_bad_input_raises_on_every_call(ready_setup) -> None:
    from greta_core.ops import _calls

    def resolve(x: Any) -> Plan:
        raise ValueError("bad input")

    cache = _calls.CallCache(resolve, 1, plan_inputs=lambda p: (p, (0,)))
    for _ in range(2):
        with pytest.raises(ValueError, match="bad input"):
            cache.launch_args(_plan._identity, False, (torch.ones(4),))
    assert cache._ready == {}


def _mixed_cache(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, _Kernel]:
    """A CallCache whose call (a, None, b, scalar) feeds a plan with its inputs permuted
    (In(0) is b, In(1) is a), scalars between pointers, two outputs referenced out of order
    and one of them not shaped like any input (torch.empty, not empty_like)."""
    from greta_core.ops import _calls

    kernel, s = _Kernel(), _support()

    def fake_direct_launch(k, grid, spec, keywords, kinds):  # type: ignore[no-untyped-def]
        slots = tuple(i for i, (kind, _) in enumerate(spec) if kind in kinds)
        return _direct.DirectLaunch(k, grid, keywords, slots, (16, 7), s)

    monkeypatch.setattr(_direct, "direct_launch", fake_direct_launch)
    plan = Plan("fake", "sm_90", (Buffer((4,), "float32"), Buffer((2,), "float16")),
                (Launch(kernel, (3, 2), (In(1), 64, Out(1), In(0), 3.5, Out(0)), {}),),
                (0, 1))  # fmt: skip
    cache = _calls.CallCache(lambda *args: plan, 3, plan_inputs=lambda p: (p, (2, 0)))
    return cache, kernel


def test_ready_launch_assembles_each_pointer_in_its_slot(monkeypatch, device) -> None:
    cache, kernel = _mixed_cache(monkeypatch)
    a, b = torch.ones(4), torch.full((4,), 2.0)
    cache.launch_args(
        _plan._identity, False, (a, None, b, "s")
    )  # Triton's path: compiled, captured
    ((_, triton_args, _),) = kernel.triton_path
    assert triton_args[0] is a and triton_args[3] is b  # the ordinary path's order
    for _ in range(2):
        y0, y1 = cache.launch_args(_plan._identity, False, (a, None, b, "s"))
        assert (y0.shape, y0.dtype) == ((4,), torch.float32)
        assert (y1.shape, y1.dtype) == ((2,), torch.float16)
        head = (3, 2, 1, 1000, "function-handle", "packed", None, None, None)
        want = (*head, a.data_ptr(), 64, y1.data_ptr(), b.data_ptr(), 3.5, y0.data_ptr(), 16, 7)
        assert kernel.compiled.launches[-1] == want
    assert len(kernel.triton_path) == 1 and len(kernel.compiled.launches) == 2
    device["device"] = 3  # the stream follows the current device; another device declines
    assert cache.launch_args(_plan._identity, False, (a, None, b, "s")) is None


def test_ready_launch_one_output_like_an_input(ready_setup) -> None:
    from greta_core.ops import _calls

    cache, kernel = ready_setup.cache, ready_setup.kernel
    x = torch.ones(4)
    cache.launch_args(_plan._identity, False, (x,))
    (ready,) = [r for r in cache._ready.values() if type(r) is _calls.ReadyLaunch]
    assert ready._one == 0  # the single-output path: allocated like the call's tensor 0
    (y,) = cache.launch_args(_plan._identity, False, (x,))
    assert y.shape == x.shape and y.dtype == x.dtype and y.data_ptr() != x.data_ptr()
    assert kernel.compiled.launches[-1][9:12] == (x.data_ptr(), 64, y.data_ptr())


@pytest.mark.parametrize("outputs", [1, 2])
def test_misaligned_output_takes_the_direct_launcher(
    monkeypatch: pytest.MonkeyPatch, device, ready_setup, outputs: int
) -> None:
    """A fresh buffer off 16-byte alignment is another specialization: the ready launch
    hands the call to the direct launcher (Triton's path for a new key) with every tensor
    in its slot."""
    if outputs == 1:
        cache, kernel = ready_setup.cache, ready_setup.kernel
        call: tuple[Any, ...] = (torch.ones(4),)
    else:
        cache, kernel = _mixed_cache(monkeypatch)
        call = (torch.ones(4), None, torch.full((4,), 2.0), "s")
    cache.launch_args(_plan._identity, False, tuple(call))
    cache.launch_args(_plan._identity, False, tuple(call))
    launches = len(kernel.compiled.launches)
    base = torch.empty(64)
    monkeypatch.setattr(torch, "empty_like", lambda t: base[1 : 1 + t.numel()].view(t.shape))
    from greta_core.ops import _calls

    for ready in cache._ready.values():  # a buffer like no input: new_empty on a call tensor
        ready._empty_like = torch.empty_like
        ready._empty = lambda source, shape, dtype: base[1:].view(dtype)[:2]
    bufs = cache.launch_args(_plan._identity, False, tuple(call))
    assert bufs[0].data_ptr() & _calls.ALIGN_MASK
    assert len(kernel.compiled.launches) == launches  # not the ready launch's kernel
    _, args, _ = kernel.triton_path[-1]
    if outputs == 1:
        assert args == (call[0], 64, bufs[0])
    else:
        assert args == (call[0], 64, bufs[1], call[2], 3.5, bufs[0])


def test_eager_ready_launch_makes_eager_raws_checks(monkeypatch, ready_setup) -> None:
    """launch_args(..., True, ...) makes eager_raw's checks in the key's pass: tensors standing in
    for CUDA ones (a subclass reporting is_cuda, counted plain) launch; a tensor wanting
    grad while grad mode is on, a dispatch mode, a subclass not counted plain, or a CPU
    tensor decline (None: the front takes its torch op)."""

    CudaLike = cuda_stand_in(monkeypatch)

    class Other(CudaLike):  # type: ignore[misc,valid-type]
        pass

    cache, kernel = ready_setup.cache, ready_setup.kernel
    x = torch.ones(4).as_subclass(CudaLike)
    cache.launch_args(_plan._identity, True, (x,))  # Triton's path; the launch captured
    (y,) = cache.launch_args(_plan._identity, True, (x,))
    assert kernel.compiled.launches[-1][9:12] == (x.data_ptr(), 64, y.data_ptr())
    n = len(kernel.compiled.launches)
    wants_grad = torch.ones(4).as_subclass(CudaLike).requires_grad_()
    assert cache.launch_args(_plan._identity, True, (wants_grad,)) is None
    with torch.no_grad():
        assert cache.launch_args(_plan._identity, True, (wants_grad,)) is not None

    with PassthroughMode():
        assert cache.launch_args(_plan._identity, True, (x,)) is None
    assert cache.launch_args(_plan._identity, True, (torch.ones(4).as_subclass(Other),)) is None
    assert cache.launch_args(_plan._identity, True, (torch.ones(4),)) is None
    assert len(kernel.compiled.launches) == n + 1  # only the no_grad call launched


# --- GPU: against Triton's own path --------------------------------------------------------


def _rms_norm_launch(x: Any, w: Any) -> _direct.DirectLaunch | None:
    from greta_core.ops import rms_norm
    from greta_core.ops.declare import Meta

    rms_norm._y_call.clear()  # no ready launch kept from an earlier test: the next call
    # takes the direct launcher (and Triton's path where nothing is captured yet)
    arch = rms_norm.validate(x, w)
    plan = rms_norm.RMS_NORM.plan(arch, Meta.of(x), Meta.of(w), 1e-6, False)  # y only
    return _plan._torch_form(plan).launches[0][4]


def _counting_triton_path(monkeypatch: pytest.MonkeyPatch, kernel: Any) -> list[int]:
    calls: list[int] = []
    real = kernel.run
    monkeypatch.setattr(kernel, "run", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    return calls


@pytest.fixture
def hook_forces_tritons_path():
    from triton import knobs

    seen: list[Any] = []
    hook = knobs.runtime.launch_enter_hook
    assert hasattr(hook, "add"), "every supported Triton (3.6+) has the launch hook chain"
    hook.add(seen.append)
    yield seen
    hook.remove(seen.append)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("offset", [0, 1])
def test_gpu_direct_launch_is_bit_identical_to_tritons_path(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, offset: int
) -> None:
    from greta_core import raw
    from greta_core.kernels.rms_norm import rms_norm_fwd_kernel

    base = torch.randn(8 * 256 + offset, device="cuda", dtype=dtype)
    x = base[offset:].view(8, 256)  # offset 1: data_ptr % 16 != 0
    assert (x.data_ptr() % 16 == 0) == (offset == 0)
    w = torch.randn(256, device="cuda", dtype=dtype)
    launch = _rms_norm_launch(x, w)
    assert launch is not None, "a plain JITFunction on the GPU launches directly"
    triton_path = _counting_triton_path(monkeypatch, rms_norm_fwd_kernel)
    launch.entries.clear()
    first = raw.rms_norm(x, w)
    direct = [raw.rms_norm(x, w) for _ in range(3)]
    torch.cuda.synchronize()
    assert triton_path == [1]  # once to compile/capture, then direct
    (key,) = launch.entries
    assert key[1][0] == (dtype, offset == 0)
    for y in direct:
        assert torch.equal(y, first)


@dataclass(frozen=True)
class _Front:
    """An op with a torch.ops front on the eager hot path, on small bf16 CUDA tensors."""

    y_call: Any  # the ops module's ForwardCall of the plan no backward follows
    tensors: tuple[Any, ...]
    raw: Any  # the raw API: no backward follows
    front: Any  # torch.ops.greta's
    if_eager: Any  # the front's hot path
    reference: Any  # the torch reference of what raw returns
    full: Any  # the plan a backward needs: (outputs..., statistics...); None: the same plan
    grad_at: int  # a tensor that may want grad (the weight, or up)
    # Per buffer of the ready launch, the argument it is allocated like (None: by shape);
    # None here: every output like the first argument.
    allocs: tuple[int | None, ...] | None = None
    # assert_close tolerances against the reference (default: torch's for the dtype).
    # Attention rounds its probabilities to bf16 before the value product: over 512 keys
    # that is ~1e-4 absolute on outputs near zero, past bf16's default atol of 1e-5.
    tolerance: dict[str, float] | None = None


_FRONT_OPS = [
    "rms_norm", "layer_norm", "layer_norm_no_bias", "add_rms_norm", "swiglu", "geglu", "rope",
    "attention", "vec_add", "softmax", "matmul", "matmul_bias",
]  # fmt: skip


def _front(op: str) -> _Front:
    import greta_core.torch  # noqa: F401  (registers torch.ops.greta.*)
    from greta_core import reference
    from greta_core.ops import (
        add_rms_norm,
        attention,
        layer_norm,
        matmul,
        rms_norm,
        rope,
        softmax,
        swiglu,
        vec_add,
    )

    g = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g)

    x, r, w, b = rand(8, 256), rand(8, 256), rand(256), rand(256)
    ops = torch.ops.greta
    if op == "rms_norm":
        return _Front(
            rms_norm._y_call, (x, w), rms_norm.rms_norm, lambda *t: ops.rms_norm(*t, 1e-6),
            rms_norm.rms_norm_if_eager, lambda *t: reference.rms_norm(*t, 1e-6),
            rms_norm.rms_norm_fwd, 1,
        )  # fmt: skip
    if op.startswith("layer_norm"):
        bias = b if op == "layer_norm" else None
        return _Front(
            layer_norm._y_call, (x, w, bias), layer_norm.layer_norm,
            lambda *t: ops.layer_norm(*t, 1e-5), layer_norm.layer_norm_if_eager,
            lambda *t: reference.layer_norm_fwd(*t, 1e-5)[0], layer_norm.layer_norm_fwd, 1,
        )  # fmt: skip
    if op == "add_rms_norm":
        return _Front(
            add_rms_norm._y_call, (x, r, w), add_rms_norm.add_rms_norm,
            lambda *t: ops.add_rms_norm(*t, 1e-6), add_rms_norm.add_rms_norm_if_eager,
            lambda *t: reference.add_rms_norm_fwd(*t, 1e-6)[:2], add_rms_norm.add_rms_norm_fwd,
            2,
        )  # fmt: skip
    if op == "rope":  # x as HF hands it: a transposed view (strided), cos/sin [S, D/2]
        xr = rand(2, 4, 16, 64).transpose(1, 2)
        cos, sin = rand(16, 32), rand(16, 32)
        return _Front(
            rope._rope_call, (xr, cos, sin), rope.rope, ops.rope, rope.rope_if_eager,
            reference.rope, None, 0, (None,),
        )  # fmt: skip
    if op == "attention":  # a decode step with GQA: one query token, 32 heads over 8
        # The ready launch allocates o like q, and the logsumexp (unused here) by shape.
        q, kv = rand(1, 32, 1, 64), rand(1, 8, 512, 64)
        return _Front(
            attention._fwd_call, (q, kv, kv * 0.5), attention.attention, ops.attention,
            attention.attention_if_eager, reference.attention, None, 0, (0, None),
            {"atol": 2e-3, "rtol": 2e-2},
        )  # fmt: skip
    if op == "vec_add":
        return _Front(
            vec_add._call, (x, r), vec_add.vec_add, ops.vec_add, vec_add.vec_add_if_eager,
            reference.vec_add, None, 1,
        )  # fmt: skip
    if op == "softmax":
        return _Front(
            softmax._fwd_call, (x,), softmax.softmax, ops.softmax, softmax.softmax_if_eager,
            reference.softmax, None, 0,
        )  # fmt: skip
    if op.startswith("matmul"):  # F.linear's form: x @ weight.t() (strided), bias or None
        # The output [8, 96] is shaped like no input: allocated by shape. Summation order
        # differs from the reference's: fp32 rounding near zero outputs, past bf16's atol.
        weight_t = rand(96, 256).t()
        bias = rand(96) if op == "matmul_bias" else None
        return _Front(
            matmul._call, (x, weight_t, bias), matmul.matmul, ops.matmul,
            matmul.matmul_if_eager, reference.matmul, None, 1, (None,),
            {"atol": 1e-3, "rtol": 1.6e-2},
        )  # fmt: skip
    activation = swiglu.OPS[op]
    return _Front(
        swiglu.DECLS[op][0].call, (x, r), lambda *t: swiglu.glu(op, *t), getattr(ops, op),
        lambda *t: swiglu.glu_if_eager(op, *t), lambda *t: reference.glu(*t, activation),
        None, 1,
    )  # fmt: skip


def _outputs(result: Any) -> list[Any]:
    return [result] if isinstance(result, torch.Tensor) else list(result)


@pytest.mark.gpu
@pytest.mark.parametrize("op", _FRONT_OPS)
def test_gpu_ready_launch_is_the_hot_path_and_bit_identical(op: str) -> None:
    from greta_core.ops import _calls

    case = _front(op)
    t = case.tensors
    case.y_call.clear()
    want = _outputs(case.raw(*t))  # the ordinary path; the kernel is captured, the launch kept
    (ready,) = [r for r in case.y_call._ready.values() if type(r) is _calls.ReadyLaunch]
    if torch.version.hip is None:  # Triton's C launcher (adapted), its CudaLauncher wrapper skipped
        assert getattr(ready._fn, "__name__", None) == "launch"
        assert type(ready._fn).__name__ != "CudaLauncher"
    # No backward follows these calls: only the outputs, each allocated like x; no stats.
    allocs = [0] * len(want) if case.allocs is None else list(case.allocs)
    assert [like for like, *_ in ready._allocs] == allocs
    got = [case.raw(*t) for _ in range(3)] + [case.front(*t)]
    full = None if case.full is None else _outputs(case.full(*t))  # with the statistics
    torch.cuda.synchronize()
    for result in got:
        for have, expected in zip(_outputs(result), want, strict=True):
            assert torch.equal(have, expected)
    for have, expected in zip(want, _outputs(case.reference(*t)), strict=True):
        torch.testing.assert_close(have, expected, **(case.tolerance or {}))
    if full is not None:  # the plan a backward needs writes the same outputs
        assert len(full) > len(want)
        for have, expected in zip(full, want, strict=False):
            assert torch.equal(have, expected)


@pytest.mark.gpu
def test_gpu_aligned_and_misaligned_get_their_own_kernels() -> None:
    from greta_core import raw, reference

    base = torch.randn(4 * 128 + 1, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(128, device="cuda", dtype=torch.bfloat16)
    aligned, misaligned = base[:-1].view(4, 128), base[1:].view(4, 128)
    launch = _rms_norm_launch(aligned, w)
    launch.entries.clear()
    for x in (aligned, misaligned, aligned, misaligned):
        torch.testing.assert_close(raw.rms_norm(x, w), reference.rms_norm(x, w, 1e-6))
    assert sorted(k[1][0][1] for k in launch.entries) == [False, True]


@pytest.mark.gpu
def test_gpu_direct_launch_uses_the_current_stream() -> None:
    from greta_core import raw

    x = torch.randn(16, 512, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(512, device="cuda", dtype=torch.bfloat16)
    want = raw.rms_norm(x, w)
    raw.rms_norm(x, w)  # the direct path is warm
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        on_side = raw.rms_norm(x, w)
    side.synchronize()
    assert torch.equal(on_side, want)
    # A launch on any stream but the capturing one fails the capture: the graph holding the
    # kernel proves the direct launch went to the current stream.
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = raw.rms_norm(x, w)
    x.mul_(2)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, raw.rms_norm(x, w))


@pytest.mark.gpu
def test_gpu_each_device_gets_its_own_kernel() -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    from greta_core import raw

    results = []
    for d in (0, 1, 0, 1):
        with torch.cuda.device(d):
            gen = torch.Generator(device=f"cuda:{d}").manual_seed(0)
            x = torch.randn(8, 256, device=f"cuda:{d}", generator=gen)
            w = torch.ones(256, device=f"cuda:{d}")
            results.append(raw.rms_norm(x, w).cpu())
    assert torch.equal(results[0], results[2]) and torch.equal(results[1], results[3])
    launch = _rms_norm_launch(x, w)
    assert {k[0] for k in launch.entries} >= {0, 1}


@pytest.mark.gpu
def test_gpu_a_launch_hook_takes_tritons_path(hook_forces_tritons_path: list[Any]) -> None:
    from greta_core import raw

    x = torch.randn(8, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(256, device="cuda", dtype=torch.bfloat16)
    quiet = raw.rms_norm(x, w)
    raw.rms_norm(x, w)
    before = len(hook_forces_tritons_path)
    hooked = [raw.rms_norm(x, w) for _ in range(3)]
    assert len(hook_forces_tritons_path) - before == 3  # Triton's path ran each call
    for y in hooked:
        assert torch.equal(y, quiet)


def _op_calls() -> dict[str, Any]:
    from greta_core import raw

    g = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g)

    x, r, w, b = rand(8, 256), rand(8, 256), rand(256), rand(256)
    q, kv = rand(2, 4, 16, 64), rand(2, 4, 32, 64)
    xr, cos, sin = rand(2, 16, 4, 64), rand(16, 32), rand(16, 32)
    a2, b2 = rand(64, 128), rand(128, 96)
    return {
        "vec_add": lambda: raw.vec_add(x, r),
        "layer_norm": lambda: raw.layer_norm(x, w, b),
        "layer_norm_no_bias": lambda: raw.layer_norm(x, w),
        "softmax": lambda: raw.softmax(x),
        "add_rms_norm": lambda: raw.add_rms_norm(x, r, w),
        "swiglu": lambda: raw.swiglu(x, r),
        "rope": lambda: raw.rope(xr, cos, sin),
        "matmul": lambda: raw.matmul(a2, b2),
        "attention": lambda: raw.attention(q, kv, kv, causal=True),
    }


@pytest.mark.gpu
@pytest.mark.parametrize(
    "op",
    ["vec_add", "layer_norm", "layer_norm_no_bias", "softmax", "add_rms_norm", "swiglu",
     "rope", "matmul", "attention"],
)  # fmt: skip
def test_gpu_every_raw_op_matches_tritons_path(
    hook_forces_tritons_path: list[Any], op: str
) -> None:
    call = _op_calls()[op]
    hook = hook_forces_tritons_path
    before = len(hook)
    by_triton = call()  # the hook is on: Triton's own path
    assert len(hook) > before
    from triton import knobs

    knobs.runtime.launch_enter_hook.remove(hook.append)
    try:
        call()  # first call of the specialization: Triton's path, the kernel captured
        direct = [call() for _ in range(2)]
    finally:
        knobs.runtime.launch_enter_hook.add(hook.append)
    torch.cuda.synchronize()
    flat = [by_triton] if isinstance(by_triton, torch.Tensor) else list(by_triton)
    for got in direct:
        got_flat = [got] if isinstance(got, torch.Tensor) else list(got)
        for want, have in zip(flat, got_flat, strict=True):
            assert torch.equal(want, have)


@pytest.mark.gpu
@pytest.mark.parametrize("op", _FRONT_OPS)
def test_gpu_eager_launch_declines_what_eager_raw_declines(op: str) -> None:
    """The torch.ops front's hot path (ForwardCall.if_eager) launches only where eager_raw
    allows the raw launcher: a tensor wanting grad, or a dispatch mode, takes the torch op."""
    from greta_core.ops import _calls

    case = _front(op)
    t = case.tensors
    wants_grad = list(t)
    wants_grad[case.grad_at] = t[case.grad_at].clone().requires_grad_()
    for _ in range(2):  # the first call captures, the second takes the ready launch
        y = _outputs(case.if_eager(*t))
    for have, expected in zip(y, _outputs(case.reference(*t)), strict=True):
        torch.testing.assert_close(have, expected, **(case.tolerance or {}))
    assert _calls.eager_raw(*t)
    assert not _calls.eager_raw(*wants_grad) and case.if_eager(*wants_grad) is None
    with torch.no_grad():
        assert _calls.eager_raw(*wants_grad)
        for have, expected in zip(_outputs(case.if_eager(*wants_grad)), y, strict=True):
            assert torch.equal(have, expected)
    with PassthroughMode():
        assert not _calls.eager_raw(*t) and case.if_eager(*t) is None
    assert case.if_eager(*(None if v is None else v.cpu() for v in t)) is None


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm", "add_rms_norm"])
def test_gpu_norm_backward_takes_the_arena_and_is_bit_identical(op: str) -> None:
    """The eager training path's backward: its first call per signature runs the ordinary
    path (fresh partials), later calls the ready launch with the partials in the current
    stream's scratch arena (layer_norm: dweight's and dbias's in one buffer, one col_sum),
    on the default stream and on a side stream alike: the same gradients, bit for bit."""
    import greta_core.torch  # noqa: F401  (registers torch.ops.greta)
    from greta_core.ops import _calls
    from greta_core.ops.declare import DECLARED

    gen = torch.Generator(device="cuda").manual_seed(0)

    def t(*shape: int) -> Any:
        x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=gen)
        return x.requires_grad_()

    n = 300
    inputs = {"rms_norm": (t(37, n), t(n)), "layer_norm": (t(37, n), t(n), t(n)),
              "add_rms_norm": (t(37, n), t(37, n), t(n))}[op]  # fmt: skip
    fn = getattr(torch.ops.greta, op)

    def grads() -> tuple[Any, ...]:
        out = fn(*inputs)
        outs = out if isinstance(out, tuple) else (out,)
        return torch.autograd.grad(outs, inputs, [torch.ones_like(o) for o in outs])

    bwd = DECLARED[f"{op}_bwd"].call
    _calls.release_scratch()
    bwd.clear()
    want = grads()  # the backward's ordinary path: its partials freshly allocated
    (ready,) = [r for r in bwd._ready.values() if type(r) is _calls.ReadyLaunch]
    assert ready._scratch > 0 and ready._more  # scratch, and a col_sum after the kernel
    device, stream = torch.cuda.current_device(), torch.cuda.current_stream()

    def arena(on: Any) -> bool:  # any thread's: autograd runs a GPU backward on its own
        return any(key[:2] == (device, on.cuda_stream) for key in _calls._ARENAS)

    assert not arena(stream)
    got = [grads() for _ in range(3)]
    assert arena(stream)  # the ready path ran
    side = torch.cuda.Stream()
    side.wait_stream(stream)
    with torch.cuda.stream(side):
        got.append(grads())
    torch.cuda.synchronize()
    assert arena(side)
    for result in got:
        for have, expected in zip(result, want, strict=True):
            assert torch.equal(have, expected)
