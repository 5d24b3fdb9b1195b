"""The Python glue of the eager hot path, timed on the CPU (no GPU needed).

``bench/host_path_breakdown.py`` times ``torch.ops.greta.rms_norm``'s steps on a GPU; this
drives the same code (``ops/_calls.py``: ``ForwardCall.if_eager``, ``CallCache.launch_args``,
``ReadyLaunch``) on the CPU with the CUDA-only pieces stood in for by cheap C builtins: a
plan shaped like ``rms_norm``'s y-only plan (bf16 [4, 64], weight [64]) whose "kernel" is
captured by the real direct launcher, Triton's launcher replaced by ``str.format`` (takes
any arguments, does nothing), the device and stream getters by ``int``, and CPU tensors of
a subclass that reports ``is_cuda`` (its ``__torch_function__`` disabled, as a plain
tensor's). Triton's real ``knobs`` back the quiet check. The torch.library hops are timed
with CPU tensors: the dispatcher's cost does not depend on the device.

Each step: the minimum over ``--repeat`` rounds (every step timed once per round) of a\ntimeit run of ``--number`` calls, in µs per call.
Compare trees on the same machine:

    PYTHONPATH=. python bench/host_path_glue.py --out bench/results/cpu/host_path_glue.json
"""

from __future__ import annotations

import argparse
import sys
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _stand_ins() -> dict[str, Any]:
    import torch
    from triton import knobs

    from greta_core.ops import _calls, _direct, _plan
    from greta_core.ops._plan import Buffer, In, Launch, Out, Plan

    class Param:
        def __init__(self, name: str) -> None:
            self.name, self.default, self.has_default = name, None, False

    class Compiled:
        function, packed_metadata = "function-handle", "packed"
        run = "".format  # Triton's launcher: any arguments, nothing done

    class Kernel:
        def __init__(self) -> None:
            names = ("x", "w", "n", "s", "eps", "y", "rstd", "BLOCK_N", "ONE_PASS", "STORE_RSTD")
            self.params = [Param(n) for n in names]
            self.pre_run_hooks: list[Any] = []

        def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., Any]:
            return lambda *a, **kw: Compiled()

    try:
        from triton.knobs import HookChain
    except ImportError:
        HookChain = None
    support = _direct.Support(Kernel, Compiled, HookChain, knobs, hip=False)

    def direct_launch(kernel, grid, spec, keywords, kinds):  # type: ignore[no-untyped-def]
        slots = tuple(i for i, (kind, _) in enumerate(spec) if kind in kinds)
        tail = _direct.bind_tail(kernel.params, len(spec), keywords)
        return _direct.DirectLaunch(kernel, grid, keywords, slots, tail, support)

    _direct.direct_launch = direct_launch
    _direct._driver = lambda: (int, int)  # current device 0, its stream 0

    class CudaLike(torch.Tensor):
        is_cuda = True
        __torch_function__ = torch._C._disabled_torch_function_impl

    probes = _calls._PROBES or _calls._eager_probes()
    _calls._PROBES = (*probes[:4], (*probes[4], CudaLike), *probes[5:])

    # rms_norm's y-only plan: (x, w, n_cols, stride, eps, y, y) + (BLOCK_N, ONE_PASS, STORE)
    kernel = Kernel()
    plan = Plan(
        "rms_norm", "sm_90", (Buffer((4, 64), "bfloat16"),),
        (Launch(kernel, (4,), (In(0), In(1), 64, 64, 1e-6, Out(0), Out(0)),
                {"BLOCK_N": 64, "ONE_PASS": True, "STORE_RSTD": False}),),
        (0,),
    )  # fmt: skip

    def resolve(x: Any, w: Any, eps: float, stats: bool) -> tuple[Any, bool]:
        return plan, False

    _, y_call = _calls.forward_calls(
        resolve, 2, lambda r: (r[0], (0, 1)), lambda r, a: (r[0], a[:2])
    )
    x = torch.randn(4, 64, dtype=torch.bfloat16).as_subclass(CudaLike)
    w = torch.randn(64, dtype=torch.bfloat16).as_subclass(CudaLike)
    for _ in range(3):
        y_call.if_eager(x, w, 1e-6)
    ready = next(v for v in y_call._ready.values() if type(v) is _calls.ReadyLaunch)
    return {"torch": torch, "calls": _calls, "plan": _plan, "y_call": y_call, "ready": ready,
            "x": x, "w": w, "support": support}  # fmt: skip


def steps() -> list[tuple[str, Callable[[], Any]]]:
    s = _stand_ins()
    torch, _calls, y_call, ready, x, w = (
        s["torch"], s["calls"], s["y_call"], s["ready"], s["x"], s["w"]
    )  # fmt: skip
    args, ptrs = (x, w, 1e-6), [x.data_ptr(), w.data_ptr()]
    launch = getattr(ready, "launch", ready)  # ReadyLaunch.__call__ in older trees
    identity = s["plan"]._identity
    if hasattr(y_call, "launch_args"):
        cache_launch = lambda eager: y_call.launch_args(identity, eager, args)  # noqa: E731
    else:  # older trees: launch(wrap, *args, eager=)
        cache_launch = lambda eager: y_call.launch(identity, *args, eager=eager)  # noqa: E731
    eps = 1e-6
    front = _front(y_call)
    hops = _hops(torch)
    xc, wc = x.as_subclass(torch.Tensor), w.as_subclass(torch.Tensor)
    rows = [
        ("front (greta::rms_norm's body)", lambda: front(x, w, eps)),
        ("ForwardCall.if_eager", lambda: y_call.if_eager(x, w, eps)),
        ("CallCache.launch_args (eager)", lambda: cache_launch(True)),
        ("CallCache.launch_args (raw)", lambda: cache_launch(False)),
        ("ReadyLaunch.launch", lambda: launch(args, ptrs)),
        ("torch.empty_like(x) (inside the above)", lambda: torch.empty_like(x)),
        ("Support.quiet() (real Triton knobs)", s["support"].quiet),
        ("eager_raw(x, w)", lambda: _calls.eager_raw(x, w)),
    ]
    rows += [(f"hop: {name}", (lambda f=f: f(xc, wc, eps))) for name, f in hops]
    return rows


def _front(y_call: Any) -> Callable[..., Any]:
    """greta_core/torch/rms_norm.py's ``_rms_norm`` body, on the stand-in ForwardCall, as
    the front calls it (through the ops module's ``*_if_eager`` where the tree has one)."""
    import torch

    from greta_core.ops import rms_norm as raw

    kernel_dtypes = (torch.float16, torch.bfloat16, torch.float32)
    raw._y_call = y_call  # the front's ForwardCall, stood in (looked up at call time)

    def front(x: Any, weight: Any, eps: float = 1e-6) -> Any:
        if x.dtype in kernel_dtypes:
            y = raw.rms_norm_if_eager(x, weight, eps)
            if y is not None:
                return y
        raise AssertionError("the stand-in must take the hot path")

    return front


def _hops(torch: Any) -> list[tuple[str, Callable[..., Any]]]:
    """Custom-op hops to a Python kernel that does nothing, registered in several ways."""
    lib = torch.library.Library("greta_glue", "DEF")
    _hops.lib = lib  # keep the registrations alive
    out: list[tuple[str, Callable[..., Any]]] = []
    for name, key in (("implicit", "CompositeImplicitAutograd"),
                      ("explicit", "CompositeExplicitAutograd"), ("cpu", "CPU")):  # fmt: skip
        lib.define(f"{name}(Tensor x, Tensor weight, float eps=1e-06) -> Tensor")
        lib.impl(name, lambda x, weight, eps=1e-6: x, key)
        packet = getattr(torch.ops.greta_glue, name)
        out.append((f"{key} (OpOverloadPacket)", packet))
        out.append((f"{key} (.default)", packet.default))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="JSON file (overwritten)")
    parser.add_argument("--number", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args(argv)
    named = steps()
    best = [float("inf")] * len(named)
    for _, fn in named:
        for _ in range(200):
            fn()
    for _ in range(args.repeat):  # rounds over every step: a busy moment reaches all alike
        for i, (_, fn) in enumerate(named):
            best[i] = min(best[i], timeit.timeit(fn, number=args.number) / args.number)
    rows = []
    for (name, _), t in zip(named, best, strict=True):
        rows.append({"step": name, "us_per_call": round(t * 1e6, 3)})
        print(f"{rows[-1]['us_per_call']:8.3f} us  {name}")
    if args.out is not None:
        from greta_core.bench.metadata import collect
        from greta_core.bench.report import write_json

        write_json(args.out, {**collect("host_path_glue", "cpu"), "number": args.number,
                              "steps": rows})  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
