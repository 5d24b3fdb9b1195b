"""Up to what size an eager training call should leave GRETA's path for PyTorch's own op.

``OpDecl.training_route`` hands the eager training calls of rms_norm, layer_norm and softmax
that the arch's ``<op>_training`` table entry gives backend "torch" (by ``ELEMENTS``, the
input's numel) to F.rms_norm / F.layer_norm / torch.softmax: their forward + backward cost
less host time than GRETA's Python autograd.Function, and GRETA's kernels win once the GPU
work outweighs the host's. This bench finds that size: for each op and input size, the time
of ``calls`` forward+backward calls **with the device synchronised inside the timed region**
(so host and GPU time both count, as they do in a training step: a host-bound call costs its
host time, a GPU-bound one its kernels'), GRETA's path (the route forced off) against the
PyTorch op, interleaved per round by ``bench/interleaved.py`` (``device_time``), median
over rounds.

``crossover_elements`` per op is the largest size at which PyTorch's op is at least as fast
as GRETA's path at that size and every smaller one: the most the table's ``ELEMENTS_max``
may be. The tables set it lower, where PyTorch's time still sits at its host floor (its
kernels hide under the host), so that a GPU-bound step keeps GRETA's faster kernels.

    python bench/route_bound.py --out <out>/route_bound.json          # GPU, bf16
    python bench/route_bound.py --device cpu --tiny --out <tmp>/r.json  # a smoke run

Writes the JSON (metadata, rows, bounds), a CSV beside it and a PNG where matplotlib is
installed.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling interleaved.py
from interleaved import interleaved_host_us, ratios_to_vendor

OPS = ("rms_norm", "layer_norm", "softmax")
HIDDEN = (2048, 4096)
ROWS = (256, 1024, 2048, 4096, 8192, 16384)
TINY_ROWS, TINY_HIDDEN = (4, 16), (32,)
CSV_FIELDS = ("op", "rows", "hidden", "elements", "vendor_us", "greta_us", "greta_vs_vendor")


def _steps(op: str, rows: int, hidden: int, device: str) -> tuple[Callable[[], Any], ...]:
    """(PyTorch's op, GRETA's entry): one forward+backward each, on the same inputs."""
    import torch
    import torch.nn.functional as F

    from greta_core.torch._declared import ops as entries

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    g = torch.Generator().manual_seed(rows * hidden)

    def t(*shape: int) -> Any:
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype).requires_grad_()

    x = t(rows, hidden)
    if op == "softmax":
        inputs: tuple[Any, ...] = (x,)
        vendor: Callable[..., Any] = lambda x: torch.softmax(x, -1)  # noqa: E731
        greta: Callable[..., Any] = entries.softmax
    elif op == "rms_norm":
        inputs = (x, t(hidden))
        vendor = lambda x, w: F.rms_norm(x, (hidden,), w, 1e-6)  # noqa: E731
        greta = lambda x, w: entries.rms_norm(x, w, 1e-6)  # noqa: E731
    else:
        inputs = (x, t(hidden), t(hidden))
        vendor = lambda x, w, b: F.layer_norm(x, (hidden,), w, b, 1e-5)  # noqa: E731
        greta = lambda x, w, b: entries.layer_norm(x, w, b, 1e-5)  # noqa: E731
    grad = torch.randn(rows, hidden, generator=g).to(device=device, dtype=dtype)

    def step(fn: Callable[..., Any]) -> Callable[[], Any]:
        return lambda: torch.autograd.grad(fn(*inputs), inputs, grad)

    return step(vendor), step(greta)


def crossover(rows: list[dict[str, Any]], op: str) -> int:
    """The largest ELEMENTS up to which PyTorch's op is at least as fast at every size (0:
    GRETA's path wins at the smallest)."""
    best = 0
    for row in sorted((r for r in rows if r["op"] == op), key=lambda r: r["elements"]):
        if row["greta_vs_vendor"] < 1.0:
            break
        best = row["elements"]
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file (CSV, PNG beside)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--calls", type=int, default=40, help="calls per case and round")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=3, help="calls of each before timing")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (a smoke run)")
    args = parser.parse_args(argv)

    import torch

    import greta_core.torch  # noqa: F401  (every op declared)
    from greta_core import configs
    from greta_core.bench.metadata import collect
    from greta_core.ops.declare import DECLARED

    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    sizes = [(r, h) for h in (TINY_HIDDEN if args.tiny else HIDDEN)
             for r in (TINY_ROWS if args.tiny else ROWS)]  # fmt: skip
    # GRETA's own path everywhere: the route is what is being sized.
    forced = {DECLARED[op].training_entry: {"backend": "greta"} for op in OPS}
    results: list[dict[str, Any]] = []
    with configs.Override(forced):
        for op in OPS:
            for rows, hidden in sizes:
                vendor, greta = _steps(op, rows, hidden, args.device)
                per_round = interleaved_host_us(
                    {("case", "vendor"): vendor, ("case", "greta"): greta},
                    args.calls, args.rounds, args.warmup, sync, device_time=True,
                )  # fmt: skip
                ratio = ratios_to_vendor(per_round, ("greta",), 3)["case"]["greta"]
                vendor, greta = per_round[("case", "vendor")], per_round[("case", "greta")]
                results.append({
                    "op": op, "rows": rows, "hidden": hidden, "elements": rows * hidden,
                    "vendor_us": round(statistics.median(vendor), 2),
                    "greta_us": round(statistics.median(greta), 2),
                    "greta_vs_vendor": ratio,
                })  # fmt: skip
                r = results[-1]
                print(f"{op:10} {rows:6}x{hidden:<5} torch {r['vendor_us']:9.1f} us  "
                      f"greta {r['greta_us']:9.1f} us  {r['greta_vs_vendor']:.2f}x")  # fmt: skip
    bounds = {op: crossover(results, op) for op in OPS}
    doc = {
        **collect("route_bound", args.device),
        "device": args.device,
        "tiny": args.tiny,
        "calls": args.calls,
        "rounds": args.rounds,
        "warmup": args.warmup,
        "results": results,
        "crossover_elements": bounds,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    with args.out.with_suffix(".csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, CSV_FIELDS)
        writer.writeheader()
        writer.writerows(results)
    _plot(results, args.out.with_suffix(".png"))
    print("crossover (elements up to which PyTorch's op is at least as fast):", bounds)
    return 0


def _plot(results: list[dict[str, Any]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for op in OPS:
        for hidden in sorted({r["hidden"] for r in results}):
            pts = sorted((r["elements"], r["greta_vs_vendor"]) for r in results
                         if r["op"] == op and r["hidden"] == hidden)  # fmt: skip
            ax.plot(*zip(*pts, strict=True), marker="o", label=f"{op} h{hidden}")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("elements (rows x hidden)")
    ax.set_ylabel("GRETA path time / PyTorch op time (fwd+bwd)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
