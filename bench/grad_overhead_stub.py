"""GRETA's own Python host cost of forward+backward per op, on a CPU, with no kernel run.

``bench/grad_overhead.py`` times the training path on a GPU, where Triton's launcher, the
CUDA allocator and the driver add their share. This probe leaves only GRETA's Python (the
front or Python entry, the eager checks, the call signature's key, the ready launch's
allocations, the autograd.Function and the declared backward) beside a bare
``torch.autograd.Function`` of two inputs (its forward and backward allocate like a norm's
and launch nothing: the floor any Python autograd path pays): every launch of every plan is
a no-op, and CPU tensors pass the eager checks (``ops._calls``' checks, recompiled with the
CUDA test inverted). Same cases (bf16) and interleaved timing as grad_overhead.py, on the
thread's CPU clock by default (a shared host's other tenants left out).

    python bench/grad_overhead_stub.py --out <tmp>/stub.json [--only rms_norm softmax]

``--config JSON`` serves keys over the config tables, as in grad_overhead.py (e.g.
``'{"norm_bwd_reduce": {"MAX_PARTIALS": 65536}}'``: the norms' backward in one launch).

``--count`` counts instead of timing, the same for every host and run: per forward+backward,
the Python frames entered and C functions called (``sys.setprofile``), the kernel launches
and torch's allocation calls by name. ``--packed`` stands in Triton 3.7+'s C launcher (its
kernel arguments as one sequence, ``ops._direct._packed``) for the flat one of 3.6.

``--lce-delegated``: linear_cross_entropy takes the path the sm_90 table gives the GPU case
(8 tokens, hidden 64: torch's own loss, ``ops.linear_cross_entropy._route``) instead of the
CPU's chunked kernel, with the GPU's Python: the table's choice forced with
``configs.Override`` (backend "torch") for the whole run; the front's "do the kernels run"
answered by a one-frame stand-in (a GPU call asks ``takes_reference``, one frame, where a
CPU call reads the environment); the target screened as a GPU target is (a tree before the
screening kernel: ``ops.linear_cross_entropy._values_on_host`` answers False, one frame as
on the GPU; after it: the route's device tests recompiled to a GPU's answers, as ``stub``
does for ``ops._calls``). No kernel runs, so a stand-in writes what the screening kernel
would (the target into its safe buffer: torch's CPU cross_entropy reads it): 1 frame and
1 C call counted beyond the GPU's. Left out (CUDA only): the deferred report's fold.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import statistics
import sys
import textwrap
import time
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benches

FLOOR = ("floor", "autograd.Function")


def _recompile(owner: Any, name: str, old: str, new: str, module: Any) -> None:
    """`owner.name` with `old` replaced by `new` in its source, in `module`'s globals."""
    fn = getattr(owner, name)
    source = textwrap.dedent(inspect.getsource(getattr(fn, "__func__", fn)))
    assert old in source, (name, old)
    found: dict[str, Any] = {}
    exec(compile(source.replace(old, new), module.__file__, "exec"), module.__dict__, found)
    setattr(owner, name, found[name])


def _recode(fn: Any, old: str, new: str, module: Any) -> None:
    """`fn` runs its source with `old` replaced by `new` (its code swapped: callers that
    hold the function itself, as a declaration's route, see the change)."""
    source = textwrap.dedent(inspect.getsource(fn))
    assert old in source, (fn.__name__, old)
    found: dict[str, Any] = {}
    exec(compile(source.replace(old, new), module.__file__, "exec"), module.__dict__, found)
    fn.__code__ = found[fn.__name__].__code__


def _no_launch(*args: Any) -> None:
    return None


class _Captured:
    """A direct launcher that launches nothing (ReadyLaunch.build's view of one)."""

    def __init__(self, grid: tuple[int, ...]) -> None:
        self._grid3 = (*grid, 1, 1)[:3]

    def usable(self) -> bool:
        return True

    def usable_parts(self) -> tuple[Any, list[Any]]:
        from greta_core.ops import _direct

        support = _direct.support()
        return (support.quiet if support is not None else (lambda: True)), []

    def captured(self, args: Any, device: int) -> tuple[Any, ...]:
        return _no_launch, self._grid3, (), ()

    def __call__(self, args: Any) -> None:
        return None


# Kernel launches the stubbed launchers saw (--count).
LAUNCHES = [0]
# torch's allocation calls, by the name sys.setprofile reports them under.
ALLOCATIONS = ("empty", "empty_like", "new_empty", "zeros", "zeros_like", "full")


def _counted_launch(*args: Any) -> None:
    LAUNCHES[0] += 1


def stub(packed: bool = False) -> None:
    """CPU tensors take the GPU hot path; no kernel runs. `packed`: the captured launcher
    takes Triton 3.7+'s form (``_direct._packed`` over a C launch)."""
    import dataclasses

    from greta_core.ops import _calls, _direct, _plan

    if hasattr(_calls, "_eager"):  # a tree before eager_training
        _recompile(_calls, "_eager", "not t.is_cuda", "t.is_cuda", _calls)
    else:
        _recompile(_calls, "eager_raw", "not t.is_cuda", "t.is_cuda", _calls)
        _recompile(_calls, "eager_training", "and t.is_cuda", "and not t.is_cuda", _calls)
    _recompile(_calls.CallCache, "launch_args", "cuda = t.is_cuda", "cuda = not t.is_cuda", _calls)
    real_form = _plan._torch_form
    forms: dict[int, Any] = {}

    def form(plan: Any) -> Any:
        got = forms.get(id(plan))
        if got is not None and got[0] is plan:
            return got[1]
        f = real_form(plan)
        launches = [(*launch[:4], _Captured(launch[1])) for launch in f.launches]
        forms[id(plan)] = (plan, dataclasses.replace(f, launches=launches))
        return forms[id(plan)][1]

    _plan._torch_form = _calls._torch_form = form
    _direct._driver = lambda: (int, int)  # device 0, stream 0
    if packed and hasattr(_direct, "_packed"):
        head = (None,) * 11  # function ... kernel_signature, as launch_form's "packed"

        def captured(self: Any, args: Any, device: int) -> tuple[Any, ...]:
            return _direct._packed(_counted_launch, head), self._grid3, (), ()

    else:

        def captured(self: Any, args: Any, device: int) -> tuple[Any, ...]:
            return _counted_launch, self._grid3, (), ()

    _Captured.captured = captured  # type: ignore[method-assign]


def count(step: Any, calls: int = 10) -> dict[str, Any]:
    """Per call of `step`: Python frames, C calls, launches, allocation calls by name."""
    import collections

    events: collections.Counter[str] = collections.Counter()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            events["python_frames"] += 1
        elif event == "c_call":
            events["c_calls"] += 1
            name = getattr(arg, "__name__", "")
            if name in ALLOCATIONS:
                events[f"alloc:{name}"] += 1

    for _ in range(3):
        step()
    LAUNCHES[0] = 0
    sys.setprofile(profile)
    try:
        for _ in range(calls):
            step()
    finally:
        sys.setprofile(None)
    events["launches"] = LAUNCHES[0]
    return {k: round(v / calls, 2) for k, v in sorted(events.items())}


def _floor_step() -> Any:
    import grad_overhead
    import torch

    class Floor(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any, w: Any, eps: float) -> Any:
            ctx.save_for_backward(x, w)
            return torch.empty_like(x)

        @staticmethod
        def backward(ctx: Any, dy: Any) -> Any:
            x, w = ctx.saved_tensors
            return torch.empty_like(x), torch.empty_like(w), None

    x = torch.randn(4, 64, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(64, dtype=torch.bfloat16, requires_grad=True)
    return grad_overhead._step(Floor.apply, (x, w), (1e-6,))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--only", nargs="*", help="these groups only")
    parser.add_argument("--clock", choices=("thread", "wall"), default="thread")
    parser.add_argument("--count", action="store_true", help="count, do not time")
    parser.add_argument("--packed", action="store_true", help="Triton 3.7+'s launcher form")
    parser.add_argument(
        "--lce-delegated",
        action="store_true",
        help="linear_cross_entropy's delegated path (with --only linear_cross_entropy)",
    )
    parser.add_argument("--config", help="JSON {op: {KEY: value}} over the config tables")
    args = parser.parse_args(argv)
    import grad_overhead

    try:
        override = grad_overhead.config_override(args.config)
    except (ValueError, OSError) as exc:
        parser.error(str(exc))
    stub(args.packed)
    with contextlib.ExitStack() as stack:
        stack.enter_context(grad_overhead.overridden(override))
        if args.lce_delegated:
            stack.enter_context(lce_delegated())
        return _run(args, override)


@contextlib.contextmanager
def lce_delegated() -> Any:
    """linear_cross_entropy on the delegated path, as on the GPU (see the docstring)."""

    from greta_core import configs
    from greta_core.ops import _validate
    from greta_core.ops import linear_cross_entropy as lce
    from greta_core.torch import _declared

    _declared.run_triton_on_cpu = lambda *tensors: True  # type: ignore[assignment]
    # The route validates as the kernels do: CPU tensors pass as the interpreter's would.
    _validate.interpreter_active = lambda: True  # type: ignore[attr-defined]
    poison = getattr(lce, "_launch_poison", None)
    if poison is not None:  # float32 logits: the screening after the product

        def poison_writes(how: Any, target: Any, logits: Any) -> Any:
            outs = poison(how, target, logits)
            outs[0].copy_(target)
            return outs

        lce._launch_poison = poison_writes
    launch = getattr(lce, "_launch_screen", None)
    if launch is None:  # a tree before the screening kernel
        lce._values_on_host = lambda target: False  # type: ignore[assignment]
    else:
        _recode(lce._route, "how.device < 0 and ", "False and ", lce)
        _recode(lce._torch_loss, "(how.device >= 0 or not _values_on_host(target))", "True", lce)

        def writes(how: Any, target: Any) -> Any:
            outs = launch(how, target)
            outs[0].copy_(target)
            return outs

        lce._launch_screen = writes
    with configs.Override({lce.DISPATCH: {"backend": "torch"}}):
        yield


def _run(args: Any, override: dict[str, dict[str, Any]] | None) -> int:
    import grad_overhead
    import interleaved
    import torch

    from greta_core.bench.metadata import collect

    torch.set_num_threads(1)
    real_to = torch.Tensor.to

    def to_bf16(self: Any, *a: Any, **k: Any) -> Any:  # the CPU cases in the kernels' dtype
        if k.get("dtype") is torch.float32:
            k["dtype"] = torch.bfloat16
        return real_to(self, *a, **k)

    torch.Tensor.to = to_bf16  # type: ignore[method-assign]
    try:
        found = grad_overhead.cases("cpu", False)
    finally:
        torch.Tensor.to = real_to  # type: ignore[method-assign]
    rows, runnable = interleaved.runnable_cases(
        (({"group": g, "variant": v, "case": name}, step, why)
         for g, v, name, step, why in found if not args.only or g in args.only),
        lambda: None,
    )  # fmt: skip
    runnable[FLOOR] = _floor_step()
    if args.count:
        return _write_counts(args, runnable, rows, override)
    if args.clock == "thread":
        interleaved.time = types.SimpleNamespace(perf_counter=time.thread_time)  # type: ignore[attr-defined]
    per = interleaved.interleaved_host_us(
        runnable, args.calls, args.rounds, args.warmup, lambda: None
    )
    floor = per[FLOOR]
    results = []
    for (group, variant), times in per.items():
        if (group, variant) == FLOOR:
            continue
        results.append({
            "group": group, "variant": variant, "host_us": round(statistics.median(times), 2),
            "over_floor_us": round(statistics.median([t - f for t, f in zip(times, floor, strict=True)]), 2),
            "per_floor": round(statistics.median([t / f for t, f in zip(times, floor, strict=True)]), 3),
        })  # fmt: skip
    doc = {
        **collect("grad_overhead_stub", "cpu"), "lce_delegated": args.lce_delegated,
        "clock": args.clock, "calls": args.calls, "rounds": args.rounds, "config": override,
        "floor_us": round(statistics.median(floor), 2), "results": results,
        "skipped": [row for row in rows if "skipped" in row],
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"floor (bare autograd.Function) {doc['floor_us']:.1f} us")
    for r in results:
        print(f"{r['group']:22} {r['variant']:22} {r['host_us']:8.1f} us  "
              f"{r['per_floor']:5.2f}x floor  +{r['over_floor_us']:.1f} us")  # fmt: skip
    return 0


def _write_counts(
    args: Any, runnable: dict[Any, Any], rows: list[Any], override: dict[str, Any] | None
) -> int:
    from greta_core.bench.metadata import collect

    results = [{"group": g, "variant": v, **count(step)} for (g, v), step in runnable.items()]
    doc = {
        **collect("grad_overhead_stub_count", "cpu"), "packed": args.packed,
        "lce_delegated": args.lce_delegated, "config": override,
        "results": results, "skipped": [row for row in rows if "skipped" in row],
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    for r in results:
        allocs = " ".join(f"{k[6:]}={v:g}" for k, v in r.items() if k.startswith("alloc:"))
        print(f"{r['group']:22} {r['variant']:22} frames {r.get('python_frames', 0):5.1f}  "
              f"C calls {r.get('c_calls', 0):5.1f}  launches {r['launches']:g}  {allocs}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
