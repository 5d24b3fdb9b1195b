"""Host cost of linear_cross_entropy's delegated path on a CPU: aten ops and time per
forward+backward, beside the PyTorch eager loss it stands for.

``bench/grad_overhead.py``'s tiny LCE case (8 tokens) is delegated by the sm_90 table to
torch's own path, so its host time is the ops GRETA adds around torch's. This probe runs
that path on CPU tensors with the GPU's Python (``bench/grad_overhead_stub.py``'s
``--lce-delegated``: the table's choice forced to "torch", the target screened as a GPU
target is, no value read on the host; Triton launches stubbed, the screening kernel's
writes stood in for). The deferred report's CUDA-only part (its fold, copies to pinned
memory and events) is not run here: see the output's ``not_counted``.

Counts: every aten op a ``TorchDispatchMode`` sees (forward, autograd's backward), by
name; the screening kernel's launch (a tree that has one, ``_launch_screen``) is counted
apart (``screen_launches``), its allocations and stand-in writes left out of the aten
count as a GPU's launch would be. Times: ``bench/interleaved.py``'s rule on the thread's
CPU clock.

    python bench/lce_host_ops.py --out <tmp>/lce_host_ops.json [--label before]

A dev probe: counts are exact for this torch; times are this host's, meaningful against
each other (vendor, variants, trees).
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benches


def variants() -> dict[str, Any]:
    """name -> (fn, inputs, extras), as grad_overhead.py's LCE case on the GPU."""
    import torch
    import torch.nn.functional as F

    import greta_core.torch  # noqa: F401  (registers torch.ops.greta)

    g = torch.Generator().manual_seed(0)
    bf16 = torch.bfloat16  # the GPU case's dtype
    hidden = torch.randn(8, 64, generator=g).to(bf16).requires_grad_()
    lm = (torch.randn(128, 64, generator=g) * 0.1).to(bf16).requires_grad_()
    target = torch.randint(0, 128, (8,), generator=g)
    out = {
        "vendor F.cross_entropy(h @ W.T)": (
            lambda h, w, y: F.cross_entropy((h @ w.T).float(), y),
            (hidden, lm),
            (target,),
        ),
        "torch.ops.greta": (torch.ops.greta.linear_cross_entropy, (hidden, lm), (target,)),
    }
    from greta_core.torch import _declared

    entry = getattr(_declared.ops, "linear_cross_entropy", None)
    if entry is not None:
        out["greta_core.torch ops (entry)"] = (entry, (hidden, lm), (target,))
    return out


def count_ops(step: Any) -> tuple[dict[str, int], int]:
    """(aten ops by name, screening launches) of one call of `step`."""
    from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

    from greta_core.ops import linear_cross_entropy as lce

    seen: collections.Counter[str] = collections.Counter()
    launches = [0]

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen[str(func.overloadpacket.__name__)] += 1
            return func(*args, **(kwargs or {}))

    # The screening's launch (before the product) or, with float32 logits, after it.
    real = {name: getattr(lce, name, None) for name in ("_launch_screen", "_launch_poison")}

    def counting(launch: Any) -> Any:
        def counted(*args: Any) -> Any:
            launches[0] += 1
            with _disable_current_modes():
                return launch(*args)

        return counted

    for name, launch in real.items():
        if launch is not None:
            setattr(lce, name, counting(launch))
    try:
        with Count():
            step()
    finally:
        for name, launch in real.items():
            if launch is not None:
                setattr(lce, name, launch)
    return dict(sorted(seen.items())), launches[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--label", default="greta")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--warmup", type=int, default=50)
    args = parser.parse_args(argv)
    import grad_overhead
    import grad_overhead_stub
    import interleaved
    import torch

    from greta_core.bench.metadata import collect

    torch.set_num_threads(1)
    grad_overhead_stub.stub()
    with grad_overhead_stub.lce_delegated():
        steps = {
            name: grad_overhead._step(fn, inputs, extra)
            for name, (fn, inputs, extra) in variants().items()
        }
        counted = {name: count_ops(step) for name, step in steps.items()}
        counts = {name: ops for name, (ops, _) in counted.items()}
        interleaved.time = types.SimpleNamespace(perf_counter=time.thread_time)  # type: ignore[attr-defined]
        per = interleaved.interleaved_host_us(
            {(name, ""): step for name, step in steps.items()},
            args.calls, args.rounds, args.warmup, lambda: None,
        )  # fmt: skip
    vendor = next(iter(steps))
    results = []
    for name in steps:
        times = per[(name, "")]
        ratio = statistics.median(t / v for t, v in zip(times, per[(vendor, "")], strict=True))
        results.append({
            "variant": name, "aten_ops": sum(counts[name].values()), "ops": counts[name],
            "screen_launches": counted[name][1],
            "host_us": round(statistics.median(times), 2), "ratio_to_vendor": round(ratio, 3),
        })  # fmt: skip
    doc = {
        "label": args.label,
        **collect("lce_host_ops", "cpu"),
        "clock": "thread", "calls": args.calls, "rounds": args.rounds,
        "not_counted": "the CUDA-only part of the deferred target report",
        "stub": "Triton launches stubbed; the GPU's Python (grad_overhead_stub --lce-delegated)",
        "results": results,
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    for r in results:
        print(f"{r['variant']:34} {r['aten_ops']:3d} aten ops  {r['screen_launches']} screen  "
              f"{r['host_us']:8.1f} us  "
              f"{r['ratio_to_vendor']:.2f}x vendor")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
