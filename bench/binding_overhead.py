"""Host time per call of GRETA's bindings on a tiny input, next to a trivial Triton launch.

Run it once per source tree with a ``--label`` into the same ``--out`` file to compare two
versions side by side in one session (runs are appended, with metadata):

    PYTHONPATH=old python bench/binding_overhead.py --label before --out overhead.json
    PYTHONPATH=.   python bench/binding_overhead.py --label after  --out overhead.json

Each case: 200 warm-up calls, then the minimum over 5 batches of ``--calls`` calls of the
host time per call (the GPU is synchronised after each batch, outside the timed region).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def cases() -> dict[str, Callable[[], Any]]:
    import torch
    import torch.nn.functional as F
    import triton
    import triton.language as tl

    import greta_core.torch  # noqa: F401  (registers torch.ops.greta)
    from greta_core import raw

    @triton.jit
    def trivial(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)

    x = torch.randn(4, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(64, device="cuda", dtype=torch.bfloat16)
    t = torch.randn(256, device="cuda")
    return {
        "trivial Triton launch": lambda: trivial[(1,)](t, 256, BLOCK=256),
        "torch.add (vendor)": lambda: torch.add(x, x),
        "F.rms_norm (vendor)": lambda: F.rms_norm(x, (64,), w, 1e-6),
        "greta_core.raw.vec_add": lambda: raw.vec_add(x, x),
        "greta_core.raw.rms_norm": lambda: raw.rms_norm(x, w, 1e-6),
        "greta_core.raw.softmax": lambda: raw.softmax(x),
        "torch.ops.greta.vec_add": lambda: torch.ops.greta.vec_add(x, x),
        "torch.ops.greta.rms_norm": lambda: torch.ops.greta.rms_norm(x, w, 1e-6),
    }


def host_us(fn: Callable[[], Any], calls: int) -> float:
    import torch

    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", required=True, help="name of this run (e.g. the tree)")
    parser.add_argument("--out", type=Path, required=True, help="JSON file; runs are appended")
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args(argv)
    import torch
    import triton

    import greta_core

    rows = [{"case": name, "host_us_per_call": round(host_us(fn, args.calls), 2)}
            for name, fn in cases().items()]  # fmt: skip
    run = {
        "label": args.label,
        "greta_core": str(Path(greta_core.__file__).parent.parent.name),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "gpu": torch.cuda.get_device_name(),
        "calls": args.calls,
        "results": rows,
    }
    doc = json.loads(args.out.read_text()) if args.out.is_file() else {"runs": []}
    doc["runs"].append(run)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    for row in rows:
        print(f"{args.label:8} {row['case']:28} {row['host_us_per_call']:8.1f} us/call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
