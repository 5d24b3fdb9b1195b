"""Host time per call of GRETA's bindings on a tiny input, next to a trivial Triton launch.

Run it once per source tree with a ``--label`` into the same ``--out`` file to compare two
versions side by side in one session (runs are appended, with metadata):

    PYTHONPATH=old python bench/binding_overhead.py --label before --out overhead.json
    PYTHONPATH=.   python bench/binding_overhead.py --label after  --out overhead.json

Each GRETA op is timed beside the PyTorch eager op it replaces (vendor), through
``torch.ops.greta`` and the raw API, on decode-sized inputs (no tensor requires grad; grad
mode stays on, as in a user's eager call), with the ratio to the vendor's time (issue 13's
target: at most 1.5x). Each case: 200 warm-up calls, then the minimum over 5 batches of
``--calls`` calls of the host time per call (the GPU is synchronised after each batch,
outside the timed region). Cases the tree under test lacks are recorded as skipped.
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

# (group, variant, case name): each GRETA op beside the PyTorch eager op it stands for.
# The rms_norm / vec_add / softmax names are those of earlier runs (comparable across runs).
Case = tuple[str, str, str]


def cases() -> list[tuple[Case, Callable[[], Any] | None, str]]:
    """((group, variant, name), call or None, why not) per case; a case the tree under test
    lacks (an older GRETA run side by side) is reported, not fatal."""
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

    dev, bf16 = "cuda", torch.bfloat16
    x = torch.randn(4, 64, device=dev, dtype=bf16)
    r = torch.randn(4, 64, device=dev, dtype=bf16)
    w = torch.randn(64, device=dev, dtype=bf16)
    b = torch.randn(64, device=dev, dtype=bf16)
    t = torch.randn(256, device=dev)
    a2, b2 = (
        torch.randn(16, 64, device=dev, dtype=bf16),
        torch.randn(64, 32, device=dev, dtype=bf16),
    )
    q = torch.randn(1, 8, 1, 64, device=dev, dtype=bf16)  # a decode step: one query token
    kv = torch.randn(1, 8, 128, 64, device=dev, dtype=bf16)
    xr = torch.randn(1, 1, 8, 64, device=dev, dtype=bf16)  # rope: [B, S, H, D]
    cos, sin = (
        torch.randn(1, 32, device=dev, dtype=bf16),
        torch.randn(1, 32, device=dev, dtype=bf16),
    )

    def rotate_half(x, cos, sin):  # torch eager RoPE (what HF models run)
        x1, x2 = x.chunk(2, dim=-1)
        c, s = cos[None, :, None, :], sin[None, :, None, :]
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)

    ops = torch.ops.greta
    groups: list[tuple[str, str, Callable[[], Any], str, Callable[[], Any]]] = [
        # (group, vendor name, vendor call, GRETA op name, raw call)
        ("vec_add", "torch.add (vendor)", lambda: torch.add(x, x), "vec_add",
         lambda: raw.vec_add(x, x)),
        ("rms_norm", "F.rms_norm (vendor)", lambda: F.rms_norm(x, (64,), w, 1e-6), "rms_norm",
         lambda: raw.rms_norm(x, w, 1e-6)),
        ("layer_norm", "F.layer_norm (vendor)", lambda: F.layer_norm(x, (64,), w, b, 1e-5),
         "layer_norm", lambda: raw.layer_norm(x, w, b, 1e-5)),
        ("softmax", "torch.softmax (vendor)", lambda: torch.softmax(x, -1), "softmax",
         lambda: raw.softmax(x)),
        ("add_rms_norm", "x + r, F.rms_norm (vendor)",
         lambda: F.rms_norm(x + r, (64,), w, 1e-6), "add_rms_norm",
         lambda: raw.add_rms_norm(x, r, w, 1e-6)),
        ("swiglu", "F.silu(g) * u (vendor)", lambda: F.silu(x) * r, "swiglu",
         lambda: raw.swiglu(x, r)),
        ("rope", "rotate-half RoPE (torch eager)", lambda: rotate_half(xr, cos, sin), "rope",
         lambda: raw.rope(xr, cos, sin)),
        ("matmul", "torch.matmul (vendor)", lambda: torch.matmul(a2, b2), "matmul",
         lambda: raw.matmul(a2, b2)),
        ("attention", "F.scaled_dot_product_attention (vendor)",
         lambda: F.scaled_dot_product_attention(q, kv, kv), "attention",
         lambda: raw.attention(q, kv, kv)),
    ]  # fmt: skip
    greta_args = {
        "vec_add": (x, x), "rms_norm": (x, w, 1e-6), "layer_norm": (x, w, b, 1e-5),
        "softmax": (x,), "add_rms_norm": (x, r, w, 1e-6), "swiglu": (x, r),
        "rope": (xr, cos, sin), "matmul": (a2, b2), "attention": (q, kv, kv),
    }  # fmt: skip
    out: list[tuple[Case, Callable[[], Any] | None, str]] = [
        (
            ("triton", "trivial", "trivial Triton launch"),
            lambda: trivial[(1,)](t, 256, BLOCK=256),
            "",
        )
    ]
    for group, vendor_name, vendor, op, raw_call in groups:
        out.append(((group, "vendor", vendor_name), vendor, ""))
        op_call = _op_call(ops, op, greta_args[op]) if hasattr(ops, op) else None
        why = "" if op_call else "not in this tree"
        out.append(((group, "torch.ops.greta", f"torch.ops.greta.{op}"), op_call, why))
        name = f"greta_core.raw.{op}"
        if hasattr(raw, op):
            out.append(((group, "raw", name), raw_call, ""))
        else:
            out.append(((group, "raw", name), None, "not in this tree"))
    return out


TARGET = 1.5  # issue 13: every torch.ops.greta op within 1.5x of its PyTorch eager op


def _op_call(ops: Any, op: str, args: tuple[Any, ...]) -> Callable[[], Any]:
    fn = getattr(ops, op)
    return lambda: fn(*args)


def greta_vs_vendor(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per group: torch.ops.greta's and raw's host time over the vendor's, same run."""
    times = {(r["group"], r["variant"]): r.get("host_us_per_call") for r in rows}
    out: dict[str, dict[str, float]] = {}
    for (group, variant), value in times.items():
        vendor = times.get((group, "vendor"))
        if variant in ("torch.ops.greta", "raw") and value and vendor:
            out.setdefault(group, {})[variant] = round(value / vendor, 2)
    return out


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

    rows: list[dict[str, Any]] = []
    for (group, variant, name), fn, why in cases():
        row: dict[str, Any] = {"case": name, "group": group, "variant": variant}
        if fn is None:
            row["skipped"] = why
        else:
            try:
                row["host_us_per_call"] = round(host_us(fn, args.calls), 2)
            except Exception as exc:  # an op this tree cannot run here: say so, go on
                row["skipped"] = f"{type(exc).__name__}: {exc}"[:200]
        rows.append(row)
    ratios = greta_vs_vendor(rows)
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
        "greta_vs_vendor": ratios,
    }
    doc = json.loads(args.out.read_text()) if args.out.is_file() else {"runs": []}
    doc["runs"].append(run)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    for row in rows:
        value = row.get("host_us_per_call")
        shown = f"{value:8.1f} us/call" if value is not None else f"skipped: {row['skipped']}"
        print(f"{args.label:8} {row['case']:42} {shown}")
    print(f"{args.label:8} host time per call / vendor's (target <= {TARGET}):")
    for group, by in ratios.items():
        print(f"{args.label:8}   {group:14} " + "  ".join(f"{v}={r:.2f}x" for v, r in by.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
