"""Host cost of linear_cross_entropy's delegated path on a CPU: aten ops and time per
forward+backward, beside the PyTorch eager loss it stands for.

``bench/grad_overhead.py``'s tiny LCE case (8 tokens) is delegated by the sm_90 table to
torch's own path, so its host time is the ops GRETA adds around torch's. This probe runs
that path on CPU tensors: the table's choice forced to "torch", the target screened as a
GPU target is (on the device, no value read: ``ops.linear_cross_entropy._values_on_host``
answers False). The deferred report's CUDA-only part (its copies to pinned memory and
events) is not run here: see the output's ``not_counted``.

Counts: every aten op a ``TorchDispatchMode`` sees (forward, autograd's backward), by
name. Times: ``bench/interleaved.py``'s rule on the thread's CPU clock.

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


def count_ops(step: Any) -> dict[str, int]:
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: collections.Counter[str] = collections.Counter()

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen[str(func.overloadpacket.__name__)] += 1
            return func(*args, **(kwargs or {}))

    with Count():
        step()
    return dict(sorted(seen.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--label", default="greta")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--warmup", type=int, default=50)
    args = parser.parse_args(argv)
    import grad_overhead
    import interleaved
    import torch

    from greta_core import configs
    from greta_core.bench.metadata import collect
    from greta_core.ops import linear_cross_entropy as lce

    torch.set_num_threads(1)
    lce._values_on_host = lambda target: False  # screened as a GPU target is
    override = configs.Override({lce.DISPATCH: {"backend": "torch"}})
    # The CPU tensors take the kernels' side of the front (where the table is read).
    import os

    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ["GRETA_TRITON_ON_CPU"] = "1"
    with override:
        steps = {
            name: grad_overhead._step(fn, inputs, extra)
            for name, (fn, inputs, extra) in variants().items()
        }
        counts = {name: count_ops(step) for name, step in steps.items()}
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
            "host_us": round(statistics.median(times), 2), "ratio_to_vendor": round(ratio, 3),
        })  # fmt: skip
    doc = {
        "label": args.label,
        **collect("lce_host_ops", "cpu"),
        "clock": "thread", "calls": args.calls, "rounds": args.rounds,
        "not_counted": "the CUDA-only part of the deferred target report",
        "results": results,
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    for r in results:
        print(f"{r['variant']:34} {r['aten_ops']:3d} aten ops  {r['host_us']:8.1f} us  "
              f"{r['ratio_to_vendor']:.2f}x vendor")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
