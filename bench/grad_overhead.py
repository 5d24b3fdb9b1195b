"""Host time of forward + backward per op, inputs requiring grad: GRETA vs PyTorch eager.

Issue 25's training target: for every op, ``torch.ops.greta.<op>`` forward and backward
together cost at most 1.5x the host time of the PyTorch eager op it replaces. The sibling of
``bench/binding_overhead.py`` (no-grad calls), with the same timing rule, in
``bench/interleaved.py``: every case gets ``--warmup`` calls, then ``--rounds`` rounds of
``--calls`` forward+backward calls per case, interleaved; a case's time is the median over
rounds and its ratio the median of the per-round ratios to its vendor.

Each op is timed twice: ``torch.ops.greta.<op>`` and its Python entry
(``greta_core.torch._declared.ops.<op>``, what apply_greta's model forwards call: no
dispatcher hop), each with its ratio (``greta_vs_vendor``, ``entry_vs_vendor``).

A call is ``torch.autograd.grad(op(*inputs), inputs, grad_outputs)``: the forward, the
autograd graph and the backward, with no gradient accumulated into ``.grad``. Inputs are
small (host-bound, as a small-batch training step's ops are).

    python bench/grad_overhead.py --out <out>/grad_overhead.json   # GPU, bf16
    python bench/grad_overhead.py --device cpu --tiny --out <tmp>/g.json  # a smoke run

Writes the JSON (metadata, per-case rows, ratios) and a CSV beside it (same stem). Ops
without a backward (kv_cache_append writes a cache in place) are listed as skipped.

``--config '{"norm_bwd_reduce": {"MAX_PARTIALS": 65536}}'`` (a JSON object, or a file
holding one) serves those keys over the config tables for the whole run
(``configs.Override``), e.g. to time a form a shipped table leaves off; the JSON records it.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling interleaved.py
from interleaved import (
    add_times,
    interleaved_host_us,
    print_cases,
    ratios_to_vendor,
    runnable_cases,
)

TARGET = 1.5  # issue 25: forward+backward host time per op within 1.5x PyTorch eager
# The variant of the Python entries (torch.ops.greta.<op> less the dispatcher's hop where the
# eager paths take the call), which apply_greta's model forwards call.
ENTRY = "greta_core.torch ops"

# What a case is: inputs that require grad, the op, the gradients of its outputs.
Step = Callable[[], Any]


def _step(fn: Callable[..., Any], inputs: tuple[Any, ...], extra: tuple[Any, ...] = ()) -> Step:
    """One forward+backward of `fn(*inputs, *extra)` with respect to `inputs`."""
    import torch

    out = fn(*inputs, *extra)
    outs = out if isinstance(out, tuple) else (out,)
    grads = tuple(torch.ones_like(o) for o in outs)
    autograd_grad = torch.autograd.grad

    def step() -> Any:
        out = fn(*inputs, *extra)
        return autograd_grad(out if isinstance(out, tuple) else (out,), inputs, grads)

    return step


def cases(device: str, tiny: bool) -> list[tuple[str, str, str, Step | None, str]]:
    """(group, variant, case name, step or None, why not): each GRETA op beside the PyTorch
    eager op it stands for. A case this tree lacks is reported, not fatal."""
    import torch
    import torch.nn.functional as F

    import greta_core.torch  # noqa: F401  (registers torch.ops.greta)

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    n = 32 if tiny else 64
    g = torch.Generator().manual_seed(0)

    def t(*shape: int, grad: bool = True, scale: float = 1.0) -> Any:
        x = (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)
        return x.requires_grad_(grad)

    x, r, w, b = t(4, n), t(4, n), t(n), t(n)
    xr = t(1, 4, 2, n)  # rope: [B, S, H, D]
    cos, sin = t(4, n // 2, grad=False), t(4, n // 2, grad=False)
    a2, b2 = t(16, n), t(n, 32)
    q, k, v = (t(1, 2, 16, n) for _ in range(3))  # [B, H, S, D]
    hidden, lm = t(8, n), t(128, n, scale=0.1)
    target = torch.randint(0, 128, (8,), generator=g).to(device)
    eps = 1e-6

    def rotate_half(x: Any, cos: Any, sin: Any) -> Any:  # torch eager RoPE (HF models')
        x1, x2 = x.chunk(2, dim=-1)
        c, s = cos[None, :, None, :], sin[None, :, None, :]
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)

    def add_norm(x: Any, r: Any, w: Any, e: float) -> tuple[Any, Any]:
        s = x + r
        return F.rms_norm(s, (s.shape[-1],), w, e), s

    def lce(h: Any, w: Any, y: Any) -> Any:
        return F.cross_entropy((h @ w.T).float(), y)

    ops = torch.ops.greta
    try:  # the Python entries greta_core.transformers calls (a tree may predate them)
        from greta_core.torch._declared import ops as entries
    except ImportError:
        entries = None
    # (group, vendor name, vendor fn, GRETA op name, inputs, non-differentiable extras):
    # both take (*inputs, *extras).
    table: list[tuple[str, str, Callable[..., Any], str, tuple[Any, ...], tuple[Any, ...]]] = [
        ("rms_norm", "F.rms_norm", lambda x, w, e: F.rms_norm(x, (n,), w, e), "rms_norm",
         (x, w), (eps,)),
        ("add_rms_norm", "x + r, F.rms_norm", add_norm, "add_rms_norm", (x, r, w), (eps,)),
        ("layer_norm", "F.layer_norm", lambda x, w, b, e: F.layer_norm(x, (n,), w, b, e),
         "layer_norm", (x, w, b), (1e-5,)),
        ("rope", "rotate-half RoPE (torch eager)", rotate_half, "rope",
         (xr,), (cos, sin)),
        ("swiglu", "F.silu(g) * u", lambda a, c: F.silu(a) * c, "swiglu", (x, r), ()),
        ("geglu", "F.gelu(g, tanh) * u", lambda a, c: F.gelu(a, approximate="tanh") * c,
         "geglu", (x, r), ()),
        ("softmax", "torch.softmax", lambda x: torch.softmax(x, -1), "softmax", (x,), ()),
        ("linear_cross_entropy", "F.cross_entropy(h @ W.T)", lce, "linear_cross_entropy",
         (hidden, lm), (target,)),
        ("attention", "F.scaled_dot_product_attention",
         lambda q, k, v, c: F.scaled_dot_product_attention(q, k, v, is_causal=c), "attention",
         (q, k, v), (True,)),
        ("matmul", "torch.matmul", torch.matmul, "matmul", (a2, b2), ()),
    ]  # fmt: skip
    out: list[tuple[str, str, str, Step | None, str]] = []
    for group, vendor_name, vendor, op, inputs, extra in table:
        out.append((group, "vendor", vendor_name, _try(vendor, inputs, extra), ""))
        if not hasattr(ops, op):
            out.append((group, "torch.ops.greta", f"torch.ops.greta.{op}", None,
                        "not in this tree"))  # fmt: skip
            continue
        out.append((group, "torch.ops.greta", f"torch.ops.greta.{op}",
                    _try(getattr(ops, op), inputs, extra), ""))  # fmt: skip
        if hasattr(entries, op):
            out.append((group, ENTRY, f"{ENTRY}.{op}", _try(getattr(entries, op), inputs, extra),
                        ""))  # fmt: skip
    if device == "cuda" or hasattr(ops, "kv_cache_append"):
        out.append(("kv_cache", "torch.ops.greta", "torch.ops.greta.kv_cache_append", None,
                    "no backward: an in-place cache write"))  # fmt: skip
    return out


def _try(fn: Callable[..., Any], inputs: tuple[Any, ...], extra: tuple[Any, ...]) -> Any:
    try:
        return _step(fn, inputs, extra)
    except Exception as exc:  # an op this tree or device cannot run: say so, go on
        return exc


def config_override(value: str | None) -> dict[str, dict[str, Any]] | None:
    """`--config`'s mapping {op: {KEY: value}} (a JSON object, or the path of a file holding
    one); None without. Raises ValueError with a one-line reason."""
    if value is None:
        return None
    text = value if value.lstrip().startswith("{") else Path(value).read_text()
    try:
        mapping = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"--config is not valid JSON: {exc}") from None
    if not isinstance(mapping, dict) or not all(isinstance(v, dict) for v in mapping.values()):
        raise ValueError('--config must map op names to objects, e.g. {"op": {"KEY": 1}}')
    return mapping


def add_grid_options(parser: argparse.ArgumentParser, result: str, scope: str, key: str) -> None:
    """The grid scripts' --config (over the config tables for `scope`) and --merge (other
    runs' `result` files folded in, a later row replacing an earlier one of the same `key`)."""
    parser.add_argument(
        "--config", help="JSON {op: {KEY: value}} (or a file holding one) over the config "
        f"tables for {scope}, e.g. a table change to A/B; the JSON records it",
    )  # fmt: skip
    parser.add_argument(
        "--merge", type=Path, nargs="+", metavar="JSON",
        help=f"fold these runs' {result} rows into --out's grid (later wins per {key}) and "
        "recompute its summary; runs nothing",
    )  # fmt: skip


def run_merge(
    parser: argparse.ArgumentParser, merge: Callable[[Any, list[Path]], int], out: Any,
    sources: list[Path],
) -> int:  # fmt: skip
    """A grid script's --merge: `merge(out, sources)`, a refusal (runs on another stack, a
    file that holds no grid) the parser's one-line error."""
    from greta_core.errors import BenchError

    try:
        return merge(out, sources)
    except (BenchError, KeyError) as exc:
        parser.error(f"--merge: {exc}")


def overridden(mapping: dict[str, dict[str, Any]] | None) -> Any:
    """The context the run takes place in: ``configs.Override(mapping)``, or nothing."""
    from greta_core import configs

    return configs.Override(mapping) if mapping else contextlib.nullcontext()


def _sync(device: str) -> Callable[[], None]:
    import torch

    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


CSV_FIELDS = ("group", "variant", "case", "host_us_per_call", "host_us_min", "ratio_to_vendor",
              "within_target", "skipped")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file (a CSV beside it)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--label", default="greta", help="name of this run (e.g. the tree)")
    parser.add_argument("--calls", type=int, default=200, help="calls per case and round")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (a smoke run)")
    parser.add_argument("--cpu", type=int, help="pin this process to one CPU core")
    parser.add_argument("--config", help="JSON {op: {KEY: value}} over the config tables")
    args = parser.parse_args(argv)
    try:
        override = config_override(args.config)
    except (ValueError, OSError) as exc:
        parser.error(str(exc))
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    with overridden(override):
        return _run(args, override)


def _run(args: Any, override: dict[str, dict[str, Any]] | None) -> int:
    from greta_core.bench.metadata import collect

    sync = _sync(args.device)
    rows, runnable = runnable_cases(
        (({"group": group, "variant": variant, "case": name}, step, why)
         for group, variant, name, step, why in cases(args.device, args.tiny)),
        sync,
    )  # fmt: skip
    per_round = interleaved_host_us(runnable, args.calls, args.rounds, args.warmup, sync)
    ratios = ratios_to_vendor(per_round, ("torch.ops.greta", ENTRY), 3)
    by_group = {
        group: by["torch.ops.greta"] for group, by in ratios.items() if "torch.ops.greta" in by
    }
    by_entry = {group: by[ENTRY] for group, by in ratios.items() if ENTRY in by}
    add_times(rows, per_round)
    for row in rows:
        ratio = ratios.get(row["group"], {}).get(row["variant"])
        if ratio is not None:
            row["ratio_to_vendor"] = ratio
            row["within_target"] = ratio <= TARGET
    doc = {
        "label": args.label,
        **collect("grad_overhead", args.device),
        "device": args.device,
        "tiny": args.tiny,
        "calls": args.calls,
        "rounds": args.rounds,
        "warmup": args.warmup,
        "cpu": args.cpu,
        "config": override,
        "target": TARGET,
        "results": rows,
        "greta_vs_vendor": by_group,
        "entry_vs_vendor": by_entry,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    with args.out.with_suffix(".csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, CSV_FIELDS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: row.get(k, "") for k in CSV_FIELDS})
    print_cases(rows, "{:9.1f} us/fwd+bwd")
    print(f"fwd+bwd host time / PyTorch eager's, median of {args.rounds} rounds "
          f"(target <= {TARGET}):")  # fmt: skip
    for group, ratio in by_group.items():
        entry = f"   {ENTRY}: {by_entry[group]:.2f}x" if group in by_entry else ""
        print(f"  {group:22} {ratio:.2f}x{entry}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
