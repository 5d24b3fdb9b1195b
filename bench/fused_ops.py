#!/usr/bin/env python3
"""The fused ops of a training step, forward + backward, side by side on one GPU:

GRETA (``torch.ops.greta``), eager PyTorch, ``torch.compile`` of the eager code, and
Liger-Kernel (when importable), for SwiGLU, GeGLU, add + RMSNorm and the linear
cross-entropy at Llama shapes (bf16). Each case first checks every implementation's output
and gradients against the eager code run in fp32 (relative L2 error), then times forward +
backward with ``triton.testing.do_bench`` (median) and records the peak memory above the
inputs. Writes ``<out>/fused_ops.{json,csv}`` (rows as they come).

    python bench/fused_ops.py                     # H100: bench/results/h100/fused_ops/
    python bench/fused_ops.py --quick --out DIR   # one shape per op, no torch.compile
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, "") and not any(Path(p, "greta_core").is_dir() for p in sys.path):
    sys.path.insert(0, str(ROOT))  # run from a source checkout without installing

FIELDS = ("op", "shape", "impl", "status", "reason", "ms", "peak_mib", "rel_err")
TOKENS = 4 * 2048


def _cases(quick: bool) -> list[tuple[str, tuple[int, ...]]]:
    cases = [
        ("swiglu", (TOKENS, 8192)),
        ("geglu", (TOKENS, 8192)),
        ("add_rms_norm", (TOKENS, 2048)),
        ("linear_cross_entropy", (TOKENS, 2048, 128256)),
    ]
    if not quick:
        cases += [
            ("swiglu", (TOKENS, 14336)),
            ("add_rms_norm", (TOKENS, 4096)),
            ("linear_cross_entropy", (TOKENS, 4096, 128256)),
        ]
    return cases


def _inputs(op: str, shape: tuple[int, ...], dtype: Any) -> tuple[list[Any], list[Any]]:
    """(differentiable inputs, other inputs), seeded."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(0)

    def randn(*s: int, scale: float = 1.0) -> Any:
        t = torch.randn(*s, generator=gen, device="cuda", dtype=torch.float32) * scale
        return t.to(dtype).requires_grad_()

    if op in ("swiglu", "geglu"):
        return [randn(*shape), randn(*shape)], []
    if op == "add_rms_norm":
        n = shape[-1]
        return [randn(*shape), randn(*shape), randn(n, scale=0.1)], []
    n, h, v = shape
    target = torch.randint(0, v, (n,), generator=gen, device="cuda")
    target[::7] = -100
    return [randn(n, h), randn(v, h, scale=h**-0.5)], [target]


def _eager(op: str) -> Callable[..., Any]:
    import torch.nn.functional as F

    if op == "swiglu":
        return lambda g, u: F.silu(g) * u
    if op == "geglu":
        return lambda g, u: F.gelu(g, approximate="tanh") * u
    if op == "add_rms_norm":

        def add_rms_norm(x: Any, r: Any, w: Any) -> Any:
            s = x + r
            return F.rms_norm(s, (s.shape[-1],), w, 1e-6), s

        return add_rms_norm
    return lambda h, w, t: F.cross_entropy((h @ w.t()).float(), t, ignore_index=-100)


def _greta(op: str) -> Callable[..., Any]:
    import torch

    import greta_core.torch  # noqa: F401

    ops = torch.ops.greta
    if op in ("swiglu", "geglu"):
        return getattr(ops, op)
    if op == "add_rms_norm":
        return lambda x, r, w: ops.add_rms_norm(x, r, w, 1e-6)
    return lambda h, w, t: ops.linear_cross_entropy(h, w, t, -100, "mean")


def _greta_chunk_scale(op: str, scale: int) -> Callable[..., Any] | None:
    if op != "linear_cross_entropy":
        return None
    from greta_core import configs

    base = _greta(op)
    override = configs.Override({op: {"CHUNK_SCALE": scale}})

    def run(*args: Any) -> Any:
        with override:
            return base(*args)

    return run


def _liger(op: str) -> Callable[..., Any] | None:
    try:
        if op == "swiglu":
            from liger_kernel.ops.swiglu import LigerSiLUMulFunction

            return LigerSiLUMulFunction.apply
        if op == "geglu":
            from liger_kernel.ops.geglu import LigerGELUMulFunction

            return LigerGELUMulFunction.apply
        if op == "linear_cross_entropy":
            from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

            loss = LigerFusedLinearCrossEntropyLoss(ignore_index=-100)
            return lambda h, w, t: loss(w, h, t)
    except Exception:  # not installed
        return None
    return None  # no Liger op for add + RMSNorm in this form


def _flat(out: Any) -> list[Any]:
    return list(out) if isinstance(out, tuple) else [out]


def _run_case(op: str, shape: tuple[int, ...], impls: list[str]) -> list[dict[str, Any]]:
    import torch
    from triton.testing import do_bench

    from greta_core.bench.timing import extra_peak_bytes

    diff, other = _inputs(op, shape, torch.bfloat16)
    # The fp32 reference: the eager code on fp32 copies.
    ref_in = [t.detach().float().requires_grad_() for t in diff]
    ref_out = _flat(_eager(op)(*ref_in, *other))
    ref_grads = torch.autograd.grad(
        ref_out, ref_in, [torch.ones_like(o) for o in ref_out], allow_unused=True
    )
    ref_all = [o.detach() for o in ref_out] + list(ref_grads)
    del ref_in, ref_out
    rows = []
    for impl in impls:
        row: dict[str, Any] = {"op": op, "shape": "x".join(map(str, shape)), "impl": impl}
        if impl.startswith("greta-chunk"):
            # linear_cross_entropy with CHUNK_SCALE overridden: the speed/memory trade of
            # the chunk size, side by side with the table's choice ("greta").
            fn = _greta_chunk_scale(op, int(impl.removeprefix("greta-chunk")))
        else:
            fn = {"greta": _greta, "eager": _eager, "liger": _liger}.get(impl, _eager)(op)
        if impl == "compile" and fn is not None:
            torch._dynamo.reset()
            fn = torch.compile(fn)
        if fn is None:
            reason = f"{impl}: not importable, or no such op"
            rows.append({**row, "status": "skipped", "reason": reason})
            continue
        try:

            def step(fn: Callable[..., Any] = fn) -> list[Any]:
                out = _flat(fn(*diff, *other))
                return [*out, *torch.autograd.grad(out, diff, [torch.ones_like(o) for o in out])]

            got = step()
            errs = [
                ((g.float() - r.float()).norm() / r.float().norm().clamp(min=1e-30)).item()
                for g, r in zip(got, ref_all, strict=True)
            ]
            del got
            peak = extra_peak_bytes(step) / 2**20
            ms = do_bench(step, warmup=5, rep=40, return_mode="median")
            row.update(status="ok", ms=ms, peak_mib=peak, rel_err=max(errs))
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            row.update(status="failed", reason=f"{exc.__class__.__name__}: {exc}"[:300])
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--quick", action="store_true", help="one shape per op")
    parser.add_argument("--impls", help="default greta,eager,compile,liger (--quick: no compile)")
    parser.add_argument("--ops", help="comma list: only these ops (default: all)")
    args = parser.parse_args(argv)
    args.impls = args.impls or ("greta,eager,liger" if args.quick else "greta,eager,compile,liger")

    import torch

    from greta_core.bench.metadata import collect
    from greta_core.bench.report import write_csv, write_json

    if not torch.cuda.is_available():
        print("fused_ops: needs a CUDA/ROCm GPU", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name(0).lower()
    tag = next((t for t in ("h100", "h200", "mi300x") if t in name), "gpu")
    out = args.out or ROOT / "bench" / "results" / tag / "fused_ops"
    out.mkdir(parents=True, exist_ok=True)
    meta = collect("quick" if args.quick else "full", "cuda")
    rows: list[dict[str, Any]] = []
    for op, shape in _cases(args.quick):
        if args.ops and op not in args.ops.split(","):
            continue
        t0 = time.time()
        rows += _run_case(op, shape, args.impls.split(","))
        write_json(out / "fused_ops.json", {"metadata": meta, "rows": rows})
        write_csv(out / "fused_ops.csv", rows, FIELDS)
        for r in rows[-len(args.impls.split(",")) :]:
            print(
                f"{op:22s} {r['shape']:18s} {r['impl']:8s} {r['status']:8s} "
                f"{r.get('ms', float('nan')):9.3f} ms {r.get('peak_mib', float('nan')):9.1f} MiB "
                f"err {r.get('rel_err', float('nan')):.2e} {r.get('reason', '')}",
                flush=True,
            )
        print(f"  ({time.time() - t0:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
