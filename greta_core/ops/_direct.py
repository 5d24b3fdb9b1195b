"""Direct launches of compiled Triton kernels: the torch executor's eager hot path.

``kernel[grid](*args)`` (Triton's ``JITFunction.run``) binds the arguments, computes the
specialization key, looks up the device, the stream and the compiled kernel and builds
launch metadata on every call: tens of microseconds of host time in Triton 3.6, more than
a small kernel runs. A plan's launch has fixed scalars, grid and options (plans are
memoized per call signature), so what can still change Triton's specialization from one
call to the next is the tensors (dtype, 16-byte alignment of the address, and on ROCm
whether the storage fits in 2 GiB: Triton's buffer-ops attribute) and the current device.
The first call with a given key takes Triton's own path and keeps the CompiledKernel it
returns; later calls hand Triton's launcher exactly what ``CompiledKernel.run`` gets from
``JITFunction.run``, on the current stream of the current device, as Triton does.

Triton's own path runs instead, on every call, whenever anything unusual is set: launch
hooks (profilers such as proton register there), ``TRITON_DEBUG`` or instrumentation,
pre-run hooks on the kernel, a kernel that is not a plain ``JITFunction`` (interpreter,
autotuner, a test's stand-in), or a Triton outside ``greta_install.triton_range`` (then
``support()`` records and logs "fast launch off", once).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from greta_core.observe import record
from greta_install import triton_range

logger = logging.getLogger("greta")

# Specializations kept per launch (alignment x dtypes x devices): a bound, not a tuning.
MAX_ENTRIES = 32
# ROCm's buffer-ops attribute: the storage spans at most this many bytes.
_HIP_BUFFER_LIMIT = 2**31 - 1
# Triton specializes a pointer on 16-byte alignment: ``ptr & ALIGN_MASK == 0``.
ALIGN_MASK = 15


def _packed(c_launch: Callable[..., Any], head: tuple) -> Callable[..., Any]:
    """Triton 3.7+'s C launcher takes the kernel arguments as one sequence: this keeps the
    flat call form (``fn(g0, g1, g2, stream, *kernel_args)``) the hot path uses."""

    def launch(g0: int, g1: int, g2: int, stream: int, *args: Any) -> None:
        c_launch(g0, g1, g2, stream, *head, args)

    # What a ready launch (ops/_calls.py) calls itself: ``c_launch(g0, g1, g2, stream,
    # *head, kernel_args)``, without this frame.
    launch.c_launch, launch.head = c_launch, head  # type: ignore[attr-defined]
    return launch


def launch_form(
    launcher: Any, function: Any, packed: Any, convention: str = "flat"
) -> tuple[Callable[..., Any], tuple]:
    """(callable, arguments between the stream and the kernel's) of a captured kernel.

    Called as ``fn(g0, g1, g2, stream, *between, *kernel_args)``. Where Triton's CudaLauncher
    wrapper would only add its constant flags and no scratch (the kernel needs none), its C
    ``launch`` is called with those constants, in the order of the Triton version's
    `convention` (``greta_install.triton_range``); otherwise the wrapper itself. Either way
    no launch metadata and no hooks (``quiet()`` holds whenever this runs).
    """
    if (
        type(launcher).__name__ == "CudaLauncher"
        and launcher.global_scratch_size == 0
        and launcher.profile_scratch_size == 0
        and not getattr(launcher, "gsan_enabled", False)
        and callable(getattr(launcher, "launch", None))
    ):
        flags = (launcher.launch_cooperative_grid, launcher.launch_pdl)
        if convention == "flat":
            return launcher.launch, (function, *flags, None, None, packed, None, None, None)
        if convention == "packed":
            head = (function, *flags, packed, None, None, None, None, None,
                    launcher.arg_annotations, launcher.kernel_signature)  # fmt: skip
            return _packed(launcher.launch, head), ()
    return launcher, (function, packed, None, None, None)


@dataclass(frozen=True)
class Support:
    """What the direct launcher needs from Triton, found once per process."""

    jit_type: type  # triton.runtime.jit.JITFunction
    compiled_type: type  # triton.compiler.compiler.CompiledKernel
    hook_chain: type | None  # triton.knobs.HookChain (None before Triton 3.4)
    knobs: Any  # triton.knobs
    hip: bool  # ROCm: the buffer-ops attribute joins the key
    convention: str = "flat"  # greta_install.triton_range.LAUNCH_CONVENTIONS

    def quiet(self) -> bool:
        """No launch hook, debug mode or instrumentation that Triton's own path would honour."""
        # Each hook unset, or an empty HookChain (hook_chain None: no chain qualifies). One
        # expression, no helper call: this runs on every ready launch.
        runtime, chain = self.knobs.runtime, self.hook_chain
        enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
        return (
            (enter is None or (type(enter) is chain and not enter.calls))
            and (leave is None or (type(leave) is chain and not leave.calls))
            and not runtime.debug
            and not self.knobs.compilation.instrumentation_mode
        )

    def capture(self, compiled: Any) -> tuple[Any, Any, Any] | None:
        """(launcher, function handle, packed metadata) of what ``kernel[grid](...)`` returned,
        or None when it is not a loaded CompiledKernel (then the launch keeps Triton's path)."""
        if type(compiled) is not self.compiled_type:
            return None
        launcher = getattr(compiled, "run", None)  # loads the module on first access
        function = getattr(compiled, "function", None)
        if not callable(launcher) or function is None or not hasattr(compiled, "packed_metadata"):
            return None
        return launcher, function, compiled.packed_metadata


@functools.cache
def support() -> Support | None:
    """The direct launcher's view of Triton, or None when it must stay off (a Triton outside
    ``greta_install.triton_range``: recorded as ``fast_launch`` in ``greta_core.observe``
    and logged once)."""
    try:
        import torch
        import triton
        from triton import knobs
        from triton.compiler.compiler import CompiledKernel
        from triton.runtime.jit import JITFunction
    except ImportError:
        return None
    try:
        from triton.knobs import HookChain
    except ImportError:
        HookChain = None
    runtime = getattr(knobs, "runtime", None)
    compilation = getattr(knobs, "compilation", None)
    if (
        runtime is None
        or compilation is None
        or not all(hasattr(runtime, a) for a in ("launch_enter_hook", "launch_exit_hook", "debug"))
        or not hasattr(compilation, "instrumentation_mode")
    ):
        return _off(f"fast launch off: Triton {triton.__version__} lacks the launch knobs")
    convention = triton_range.launch_convention(triton.__version__)
    if convention is None:
        return _off(triton_range.fast_launch_off_reason(triton.__version__) or "")
    return Support(
        JITFunction, CompiledKernel, HookChain, knobs, torch.version.hip is not None, convention
    )


def _off(reason: str) -> None:
    """Say once, visibly, why eager launches take Triton's own path."""
    record("fast_launch", reason)
    logger.warning("greta: %s: kernels launch through Triton's own path", reason)
    return None


@functools.cache
def _driver() -> tuple[Callable[[], int], Callable[[int], int]]:
    """Triton's own current-device and current-stream getters (torch's, on CUDA and ROCm)."""
    from triton.runtime import driver

    active = driver.active
    return active.get_current_device, active.get_current_stream


def current_device_getter(get_device: Callable[[], int]) -> Callable[[], int]:
    """`get_device` without the lazy-init check when it is torch's
    ``torch.cuda.current_device`` (Triton's getter on CUDA and ROCm), for callers that
    already launched on the device; any other getter as it is."""
    import torch

    if get_device is torch.cuda.current_device:
        return getattr(torch._C, "_cuda_getDevice", get_device)
    return get_device


def bind_tail(
    params: Sequence[Any], n_args: int, keywords: Mapping[str, Any]
) -> tuple[Any, ...] | None:
    """The kernel parameters after the `n_args` positional ones, as Triton's binder fills
    them (keyword, else default): constexpr values the launcher skips, and scalars. None
    when one has neither (Triton's own path then raises the error the user should see)."""
    tail = []
    for p in params[n_args:]:
        if p.name in keywords:
            tail.append(keywords[p.name])
        elif p.has_default:
            tail.append(p.default)
        else:
            return None
    return tuple(tail)


def tensor_key(args: Sequence[Any], slots: Sequence[int], hip: bool) -> tuple[Any, ...]:
    """What Triton specializes on in the tensor arguments at `slots`: dtype and 16-byte
    alignment (``get_tensor_specialization``), the ROCm buffer-ops range, None passed."""
    if hip:
        return tuple([
            None if (t := args[i]) is None
            else (t.dtype, not t.data_ptr() & ALIGN_MASK,
                  t.untyped_storage().size() <= _HIP_BUFFER_LIMIT)
            for i in slots
        ])  # fmt: skip
    # One comprehension: this runs on every launch.
    return tuple(
        [
            None if (t := args[i]) is None else (t.dtype, not t.data_ptr() & ALIGN_MASK)
            for i in slots
        ]
    )


class DirectLaunch:
    """One plan launch: its compiled kernels per specialization key, launched directly."""

    __slots__ = ("_grid3", "_slots", "_support", "_tail", "entries", "grid", "kernel", "keywords")

    def __init__(
        self,
        kernel: Any,
        grid: tuple[int, ...],
        keywords: Mapping[str, Any],
        slots: tuple[int, ...],
        tail: tuple[Any, ...],
        support: Support,
    ):
        self.kernel = kernel
        self.grid = grid
        self.keywords = dict(keywords)
        self._grid3 = (*grid, 1, 1)[:3]
        self._slots = slots  # positions of the tensor arguments (In / Out references)
        self._tail = tail
        self._support = support
        # Per (device, tensor_key): the launch form of the captured kernel (launch_form).
        self.entries: dict[tuple[Any, ...], tuple[Callable[..., Any], tuple]] = {}

    def usable(self) -> bool:
        """False while Triton's own path must run (a hook, debug mode, a pre-run hook)."""
        return self._support.quiet() and not self.kernel.pre_run_hooks

    def usable_parts(self) -> tuple[Callable[[], bool], list[Any]]:
        """What :meth:`usable` reads (Triton's quiet check, the kernel's pre-run hooks, a
        list that grows in place), for a hot path that makes the check inline."""
        return self._support.quiet, self.kernel.pre_run_hooks

    def key(self, args: Sequence[Any], device: int) -> tuple[Any, ...]:
        return (device, tensor_key(args, self._slots, self._support.hip))

    def __call__(self, args: list[Any]) -> None:
        if not self.usable():
            self.kernel[self.grid](*args, **self.keywords)
            return
        get_device, get_stream = _driver()
        device = get_device()
        key = self.key(args, device)
        entry = self.entries.get(key)
        if entry is None:
            compiled = self.kernel[self.grid](*args, **self.keywords)
            captured = self._support.capture(compiled)
            if captured is not None:
                if len(self.entries) >= MAX_ENTRIES:
                    self.entries.clear()
                self.entries[key] = launch_form(*captured, self._support.convention)
            return
        fn, between = entry
        g0, g1, g2 = self._grid3
        fn(g0, g1, g2, get_stream(device), *between, *args, *self._tail)

    def captured(
        self, args: Sequence[Any], device: int
    ) -> tuple[Callable[..., Any], tuple[int, int, int], tuple, tuple[Any, ...]] | None:
        """(launch callable, 3-D grid, arguments between stream and kernel arguments, trailing
        parameters) of the kernel captured for `args` on `device`, or None (not captured)."""
        entry = self.entries.get(self.key(args, device))
        if entry is None:
            return None
        return entry[0], self._grid3, entry[1], self._tail


def direct_launch(
    kernel: Any, grid: tuple[int, ...], spec: Sequence[tuple[int, Any]], keywords: Mapping[str, Any],
    tensor_kinds: tuple[int, ...],
) -> DirectLaunch | None:  # fmt: skip
    """A DirectLaunch for a plan launch, or None where Triton's own path must run: no usable
    Triton, a kernel that is not a plain JITFunction, arguments its signature cannot bind."""
    s = support()
    if s is None or type(kernel) is not s.jit_type:
        return None
    params = getattr(kernel, "params", None)
    if params is None or len(spec) > len(params):
        return None
    tail = bind_tail(params, len(spec), keywords)
    if tail is None:
        return None
    slots = tuple(i for i, (kind, _) in enumerate(spec) if kind in tensor_kinds)
    return DirectLaunch(kernel, grid, keywords, slots, tail, s)
