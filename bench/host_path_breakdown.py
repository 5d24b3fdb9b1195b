"""Where the host time of one eager ``torch.ops.greta.rms_norm`` call goes, step by step.

Each step of the eager hot path (see docs/en/architecture.md, "the eager hot path") is
timed on its own, beside ``F.rms_norm`` and torch's own pieces (an allocation, a
custom-op hop to a Python kernel that does nothing), on the decode-sized input of
``bench/binding_overhead.py`` (bf16 [4, 64]). Timing as there: 200 warm-up calls, then the
minimum over 5 batches of ``--calls`` calls (GPU synchronised between batches, untimed).

    python bench/host_path_breakdown.py --out bench/results/<gpu>/host_path_breakdown.json
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from binding_overhead import host_us  # the per-op benchmark's timing rule


def steps() -> list[tuple[str, Callable[[], Any]]]:
    import torch
    import torch.nn.functional as F

    import greta_core.torch  # noqa: F401  (registers torch.ops.greta)
    from greta_core import observe
    from greta_core.ops import _direct
    from greta_core.ops import rms_norm as raw
    from greta_core.ops._calls import eager_raw
    from greta_core.ops._plan import _identity

    x = torch.randn(4, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(64, device="cuda", dtype=torch.bfloat16)
    eps = 1e-6
    raw.rms_norm(x, w, eps)  # the ordinary path once: captures the ready launch
    raw.rms_norm(x, w, eps)
    call = raw._y_call  # raw.rms_norm's (y only: no backward follows)
    ready = next(v for v in call._ready.values() if v is not False)
    ptrs = [x.data_ptr(), w.data_ptr()]
    args = (x, w, eps)
    get_device, get_stream = _direct._driver()
    index = get_device()
    bufs = ready.launch(args, ptrs)
    stream = get_stream(index)
    # The launcher's arguments as ReadyLaunch.launch picks them (see ops/_calls.py).
    src = [*ready._consts, *ptrs, *(b.data_ptr() for b in bufs), stream]
    # Triton 3.7+'s packed convention: the kernel's arguments as one trailing tuple.
    fixed = (*ready._pick(src), *(() if ready._args is None else (ready._args(src),)))
    steps.bufs = bufs  # the buffers those pointers name stay allocated

    lib = torch.library.Library("greta_probe", "DEF")
    lib.define("noop(Tensor x, Tensor weight, float eps=1e-06) -> Tensor")
    lib.impl("noop", lambda x, weight, eps=1e-6: x, "CompositeImplicitAutograd")
    steps.lib = lib  # keep the registration alive

    def key() -> Any:
        k: tuple[Any, ...] = (None, eps)
        for t in (x, w):
            k += (t.dtype, t.device, t.shape, t.stride(), t.data_ptr() & 15 == 0)
        return hash(k)

    return [
        ("F.rms_norm (vendor)", lambda: F.rms_norm(x, (64,), w, eps)),
        ("torch.ops.greta.rms_norm", lambda: torch.ops.greta.rms_norm(x, w, eps)),
        ("greta_core.raw.rms_norm", lambda: raw.rms_norm(x, w, eps)),
        ("CallCache.launch_args (key, lookup, ready)",
         lambda: call.launch_args(_identity, False, args)),
        ("ReadyLaunch.launch", lambda: ready.launch(args, ptrs)),
        ("launcher only (fixed pointers)", lambda: ready._fn(*fixed)),
        ("torch.empty bf16 [4, 64]", lambda: torch.empty((4, 64), dtype=torch.bfloat16, device=x.device)),
        ("torch.empty fp32 [4]", lambda: torch.empty((4,), dtype=torch.float32, device=x.device)),
        ("torch.empty_like(x)", lambda: torch.empty_like(x)),
        ("x.new_empty((4, 64))", lambda: x.new_empty((4, 64))),
        # How a ready launch allocates a buffer like no input (a norm's rstd, its partials).
        ("x.new_empty((4,), dtype=fp32)", lambda: x.new_empty((4,), dtype=torch.float32)),
        ("custom-op hop to a no-op Python kernel", lambda: torch.ops.greta_probe.noop(x, w, eps)),
        ("eager_raw(x, w)", lambda: eager_raw(x, w)),
        ("signature key build + hash", key),
        ("_direct._driver()", _direct._driver),
        ("get_device() (torch.cuda.current_device)", get_device),
        ("torch._C._cuda_getDevice()", torch._C._cuda_getDevice),
        ("get_stream(index)", lambda: get_stream(index)),
        ("DirectLaunch.usable()", ready._launches[0][0].usable),
        ("observe.record", lambda: observe.record("rms_norm", "triton", "x")),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file (overwritten)")
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args(argv)
    rows = []
    for name, fn in steps():
        rows.append({"step": name, "host_us_per_call": round(host_us(fn, args.calls), 2)})
        print(f"{rows[-1]['host_us_per_call']:8.2f} us  {name}")
    from greta_core.bench.metadata import collect
    from greta_core.bench.report import write_json

    write_json(args.out, {**collect("host_path_breakdown", "cuda"), "calls": args.calls,
                          "steps": rows})  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
