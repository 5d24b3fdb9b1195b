#!/usr/bin/env python3
"""Linear cross-entropy, forward + backward, over a grid of token counts x vocabularies x
hidden sizes: GRETA against torch core's ``F.linear_cross_entropy`` (default and memory-lean
options), Liger-Kernel and the naive linear + float32 cross-entropy, on one GPU.

Per cell and variant: the median time of forward + backward (``triton.testing.do_bench``),
the peak memory above the inputs (the gradients included, as bench/fused_ops.py counts it),
and the relative error of the loss and of both gradients against a float32 reference (chunked
torch on float32 copies of the same bf16 inputs). Variants:

- ``core``: ``F.linear_cross_entropy(..., options=None)`` (torch >= 2.13: linear + CE);
- ``core-lean``: ``options=LinearCrossEntropyOptions()`` (torch's chunked path, its defaults);
- ``core-lean-compact``: ``LinearCrossEntropyOptions(acc_policy="compact")`` where the
  field exists;
- ``liger``: ``LigerFusedLinearCrossEntropyLoss``;
- ``naive``: ``F.cross_entropy(F.linear(h, w).float(), t)`` (transformers' loss);
- ``greta``: ``torch.ops.greta.linear_cross_entropy`` as dispatched by the config table
  (the ``impl`` column says what ran);
- ``greta-kernel``: GRETA's chunked kernel forced (the table's chunk schedule);
- ``greta-kernel-nofloor``: the kernel with CHUNK_FLOOR 0 (the schedule before issue 26);
- ``greta-kernel-scale1``: the kernel with CHUNK_SCALE 1 (the table's floor kept);
- ``greta-kernel-liger-chunk``: the kernel at Liger's own chunk rows (CHUNK_SCALE 1,
  CHUNK_FLOOR 0: ``next_pow2(tokens / ceil(vocab / hidden))``), so at Liger's memory: the
  kernel's time where the memory half of the criterion holds by construction;
- ``greta-kernel-lean``: CHUNK_SCALE 1 with half the table's floor (at least hidden/8 rows):
  the fewest chunks whose logits stay within MEM_TOL of Liger's memory at 8192 tokens and
  hidden 4096 (512 rows where the table's floor makes 1024).

``--rounds K`` times every variant of a cell K times, interleaved (a different variant first
in each round), and reports the median: a GPU's clock drifts over a cell's seconds, and one
pass per variant in a fixed order put that drift into the ratios (run to run, a cell's GRETA
time moved about 4%).

``--config '{"linear_cross_entropy": {"CHUNK_FLOOR": 0.5}}'`` runs every GRETA variant
under that change to the config tables (an A/B of a table value before it is committed).

Each cell's ``verdict`` applies issue 26's criterion to ``greta``: at or below the fastest
torch-core time (within TIME_TOL) at or below Liger's memory (within MEM_TOL), or delegating
("delegates": the table sent the call to torch, "delegates-over-memory" where that took
more than MEM_TOL over Liger's memory). At the end the script prints the largest N/H (at most
DELEGATE_MAX_N_PER_H) up to which torch's unchunked path beat GRETA's kernel in every cell:
the ``N_per_H_max`` of the table rule these numbers support.

``--merge A.json B.json ...`` folds the rows of other runs into ``--out``'s grid (a later
file's row replaces an earlier one of the same cell and variant) and recomputes the summary
without a GPU: for a grid split over device calls, or a variant rerun alone.

Cells run largest-last and stop being started after ``--budget-s`` seconds (the rows so far
are written after every cell): split the grid with --tokens/--vocabs/--hiddens to fit a
device call. A cell that runs out of memory is a row with status "oom".

    python bench/lce_grid.py --out DIR                       # the full grid (~6 min, H100)
    python bench/lce_grid.py --out DIR --tokens 512,2048 --variants greta,core,liger
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, "") and not any(Path(p, "greta_core").is_dir() for p in sys.path):
    sys.path.insert(0, str(ROOT))  # run from a source checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling grad_overhead.py

from grad_overhead import (  # noqa: E402
    add_grid_options,
    config_override,
    overridden,
    run_merge,
)

# The GRETA kernel forced (the dispatch table bypassed), each under its change to the
# linear_cross_entropy table entry.
FORCED = {
    "greta-kernel": {},
    "greta-kernel-nofloor": {"CHUNK_FLOOR": 0.0},
    "greta-kernel-scale1": {"CHUNK_SCALE": 1},
    "greta-kernel-liger-chunk": {"CHUNK_SCALE": 1, "CHUNK_FLOOR": 0.0},
    "greta-kernel-lean": {"CHUNK_SCALE": 1, "CHUNK_FLOOR": 0.125},
}
VARIANTS = ("core", "core-lean", "core-lean-compact", "liger", "naive", "greta", *FORCED)
CORE_VARIANTS = ("core", "core-lean", "core-lean-compact")
TOKENS = (512, 2048, 8192, 32768)
VOCABS = (32000, 128256, 262144)
HIDDENS = (2048, 4096)
FIELDS = (
    "tokens", "vocab", "hidden", "variant", "status", "reason", "impl", "ms", "extra_gib",
    "loss_rel_err", "dh_rel_err", "dw_rel_err",
)  # fmt: skip
SUMMARY_FIELDS = (
    "tokens", "vocab", "hidden", "n_per_h", "greta_impl", "greta_ms", "best_core", "best_core_ms",
    "greta_vs_core", "greta_gib", "liger_gib", "greta_vs_liger_mem", "verdict",
    "liger_chunk_vs_core", "liger_chunk_vs_liger_mem",
)  # fmt: skip
# Timing noise of a median of do_bench on one GPU: a GRETA time within 3% of core's counts
# as "at core's time".
TIME_TOL = 0.03
# Memory "at Liger's": within 12%. Issue 26 calls GRETA's 0.64 / 0.58 GiB (1.10x) and
# 1.57 / 1.43 GiB (1.10x) at Liger's memory; 2% more for the caching allocator's rounding.
MEM_TOL = 0.12
# Where torch's unchunked path may take a call (issue 26: "torch core's or plain CE below
# the token count where chunking does not pay"), bounded by memory: at N/H <= 1 the whole
# logits are no larger than the [vocab, hidden] weight gradient every implementation holds.
# Above it the unchunked path's memory grows past the model-level peaks the HF grid holds
# GRETA to (8192 tokens at hidden 2048: 5.9 GiB against the kernel's 0.67).
DELEGATE_MAX_N_PER_H = 1.0
IGNORE = -100


def _inputs(n: int, h: int, v: int, device: str = "cuda", seed: int = 0) -> tuple[Any, Any, Any]:
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    hidden = torch.randn(n, h, generator=gen, device=device, dtype=torch.bfloat16)
    weight = torch.randn(v, h, generator=gen, device=device, dtype=torch.float32) * h**-0.5
    target = torch.randint(0, v, (n,), generator=gen, device=device)
    target[::7] = IGNORE
    return hidden, weight.to(torch.bfloat16), target


def reference(hidden: Any, weight: Any, target: Any, rows: int = 1024) -> tuple[float, Any, Any]:
    """(loss, dhidden, dweight) of the mean loss in float32 from the bf16 inputs, chunked
    so the float32 logits never exist whole (a [32768, 262144] float32 tensor is 32 GiB)."""
    import torch

    h32, w32 = hidden.float(), weight.float()
    n_valid = max(1, int((target != IGNORE).sum()))
    loss = torch.zeros((), dtype=torch.float64, device=hidden.device)
    dh = torch.empty_like(h32)
    dw = torch.zeros_like(w32)
    for s in range(0, hidden.shape[0], rows):
        t = target[s : s + rows]
        logits = h32[s : s + rows] @ w32.t()
        lse = torch.logsumexp(logits, dim=1)
        valid = t != IGNORE
        picked = logits.gather(1, t.clamp(min=0).unsqueeze(1)).squeeze(1)
        loss += ((lse - picked) * valid).double().sum()
        grad = torch.softmax(logits, dim=1)
        del logits
        grad[valid, t[valid]] -= 1.0
        grad *= (valid.float() / n_valid).unsqueeze(1)
        dh[s : s + rows] = grad @ w32
        dw.addmm_(grad.t(), h32[s : s + rows])
        del grad
    return float(loss / n_valid), dh, dw


def _options(**fields: Any) -> Any:
    """torch's LinearCrossEntropyOptions with the fields this torch has (None: no class)."""
    import dataclasses

    import torch

    cls = getattr(torch.nn, "LinearCrossEntropyOptions", None) or getattr(
        torch.nn.functional, "LinearCrossEntropyOptions", None
    )
    if cls is None:
        return None
    names = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    if any(k not in names for k in fields):
        return None
    return cls(**fields)


def variant_fn(variant: str) -> tuple[Callable[..., Any] | None, str]:
    """(loss function of (hidden, weight, target), reason when there is none)."""
    import torch
    import torch.nn.functional as F

    core = getattr(F, "linear_cross_entropy", None)
    if variant in CORE_VARIANTS:
        if core is None:
            return None, f"torch {torch.__version__} has no F.linear_cross_entropy (>= 2.13)"
        opts = {"core": None, "core-lean": _options(),
                "core-lean-compact": _options(acc_policy="compact")}[variant]  # fmt: skip
        if variant != "core" and opts is None:
            return None, f"torch {torch.__version__}: no LinearCrossEntropyOptions for {variant}"
        kw = {} if opts is None else {"options": opts}
        return (lambda h, w, t: core(h, w, t, ignore_index=IGNORE, **kw)), ""
    if variant == "naive":
        return (lambda h, w, t: F.cross_entropy(F.linear(h, w).float(), t, ignore_index=IGNORE)), ""
    if variant == "liger":
        try:
            from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
        except Exception as exc:
            return None, f"liger_kernel not importable: {exc.__class__.__name__}: {exc}"[:200]
        loss = LigerFusedLinearCrossEntropyLoss(ignore_index=IGNORE)
        return (lambda h, w, t: loss(w, h, t)), ""
    import greta_core.torch  # noqa: F401
    from greta_core import configs

    op = torch.ops.greta.linear_cross_entropy
    if variant == "greta":
        return (lambda h, w, t: op(h, w, t, IGNORE, "mean")), ""
    override: dict[str, dict[str, Any]] = {"linear_cross_entropy_dispatch": {"backend": "greta"}}
    if FORCED[variant]:
        override["linear_cross_entropy"] = FORCED[variant]

    def forced(h: Any, w: Any, t: Any) -> Any:
        with configs.Override(override):
            return op(h, w, t, IGNORE, "mean")

    return forced, ""


def _rel(got: Any, want: Any) -> float:
    return float((got.float() - want).norm() / want.norm().clamp(min=1e-30))


def _median_ms(fn: Callable[[], Any], runs: int = 3) -> float:
    """CPU stand-in for do_bench (the CPU test of this script): median of a few calls."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def run_cell(
    n: int, h: int, v: int, variants: list[str], device: str = "cuda", rounds: int = 1
) -> list[dict[str, Any]]:
    """One row per variant: its errors and memory from one call each, then its time, the
    median over `rounds` interleaved rounds (round k starts at the k-th variant)."""
    import torch

    from greta_core import observe
    from greta_core.bench.timing import extra_peak_bytes

    on_gpu = device != "cpu"
    if on_gpu:
        from triton.testing import do_bench

        def time_ms(fn: Callable[[], Any]) -> float:
            return do_bench(fn, warmup=5, rep=40, return_mode="median")
    else:
        time_ms = _median_ms
    hidden, weight, target = _inputs(n, h, v, device)
    ref_loss, ref_dh, ref_dw = reference(hidden, weight, target)
    rows: list[dict[str, Any]] = []
    steps: dict[int, Callable[[], Any]] = {}
    for variant in variants:
        row: dict[str, Any] = {"tokens": n, "vocab": v, "hidden": h, "variant": variant}
        rows.append(row)
        fn, reason = variant_fn(variant)
        if fn is None:
            row.update(status="skipped", reason=reason)
            continue
        hg, wg = hidden.clone().requires_grad_(), weight.clone().requires_grad_()

        def step(fn: Callable[..., Any] = fn, hg: Any = hg, wg: Any = wg) -> tuple[Any, ...]:
            loss = fn(hg, wg, target)
            return (loss, *torch.autograd.grad(loss, (hg, wg)))

        try:
            observe.reset()
            loss, dh, dw = step()
            row["impl"] = observe.last_implementation("linear_cross_entropy") or variant
            row["loss_rel_err"] = abs(float(loss.detach()) - ref_loss) / abs(ref_loss)
            row["dh_rel_err"], row["dw_rel_err"] = _rel(dh, ref_dh), _rel(dw, ref_dw)
            del loss, dh, dw
            if on_gpu:
                row["extra_gib"] = extra_peak_bytes(step) / 2**30
            steps[len(rows) - 1] = step
        except Exception as exc:
            row.update(_failure(exc))
        del hg, wg
    del ref_dh, ref_dw
    times: dict[int, list[float]] = {i: [] for i in steps}
    order = list(steps)
    for k in range(rounds if order else 0):
        for i in order[k % len(order) :] + order[: k % len(order)]:
            if i not in steps:
                continue
            try:
                times[i].append(time_ms(steps[i]))
            except Exception as exc:
                rows[i].update(_failure(exc))
                del steps[i], times[i]
    for i, ts in times.items():
        rows[i].update(status="ok", ms=statistics.median(ts), ms_rounds=ts)
    # The steps hold every variant's input copies: dropped before the cache is emptied.
    steps.clear()
    if on_gpu:
        torch.cuda.empty_cache()
    return rows


def _failure(exc: Exception) -> dict[str, str]:
    """A row's status and reason for a variant that raised: "oom", else "failed" (its
    traceback on stderr)."""
    import torch

    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return {"status": "oom", "reason": str(exc).splitlines()[0][:200]}
    traceback.print_exc(file=sys.stderr)
    return {"status": "failed", "reason": f"{exc.__class__.__name__}: {exc}"[:300]}


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per cell: GRETA (as dispatched) against the fastest torch-core variant and
    Liger's memory, with issue 26's verdict."""
    cells: dict[tuple[int, int, int], dict[str, dict[str, Any]]] = {}
    for r in rows:
        cells.setdefault((r["tokens"], r["vocab"], r["hidden"]), {})[r["variant"]] = r
    out = []
    for (n, v, h), by in sorted(cells.items()):
        ok = {k: r for k, r in by.items() if r.get("status") == "ok"}
        greta, liger = ok.get("greta"), ok.get("liger")
        cores = [ok[k] for k in CORE_VARIANTS if k in ok]
        best = min(cores, key=lambda r: r["ms"]) if cores else None
        s: dict[str, Any] = {"tokens": n, "vocab": v, "hidden": h, "n_per_h": n / h}
        if greta:
            s.update(greta_impl=greta.get("impl"), greta_ms=greta["ms"])
            s["greta_gib"] = greta.get("extra_gib")
        if best:
            s.update(best_core=best["variant"], best_core_ms=best["ms"])
        if liger:
            s["liger_gib"] = liger.get("extra_gib")
        if greta and best:
            s["greta_vs_core"] = greta["ms"] / best["ms"]
        if s.get("greta_gib") is not None and s.get("liger_gib"):
            s["greta_vs_liger_mem"] = s["greta_gib"] / s["liger_gib"]
        s["verdict"] = verdict(s)
        # The kernel at Liger's chunk rows: its time where the memory half holds.
        frontier = ok.get("greta-kernel-liger-chunk")
        if frontier and best:
            s["liger_chunk_vs_core"] = frontier["ms"] / best["ms"]
        if frontier and frontier.get("extra_gib") is not None and s.get("liger_gib"):
            s["liger_chunk_vs_liger_mem"] = frontier["extra_gib"] / s["liger_gib"]
        out.append(s)
    return out


def verdict(s: dict[str, Any]) -> str:
    """issue 26's criterion for one cell (a summary row)."""
    if "greta_ms" not in s:
        return "no-greta"
    impl = s.get("greta_impl") or ""
    fast = "greta_vs_core" not in s or s["greta_vs_core"] <= 1 + TIME_TOL
    lean = "greta_vs_liger_mem" not in s or s["greta_vs_liger_mem"] <= 1 + MEM_TOL
    if impl.startswith("torch"):
        return "delegates" if lean else "delegates-over-memory"
    if fast and lean:
        return "ahead" if "greta_vs_core" in s else "no-core"
    return "slower" if lean else ("over-memory" if fast else "slower+over-memory")


def suggested_threshold(rows: list[dict[str, Any]]) -> float | None:
    """The largest N/H, at most DELEGATE_MAX_N_PER_H, at which torch core's unchunked path
    was faster than GRETA's kernel in every cell measured there and at every smaller N/H;
    None when it never was."""
    cells: dict[tuple[int, int, int], dict[str, dict[str, Any]]] = {}
    for r in rows:
        if r.get("status") == "ok":
            cells.setdefault((r["tokens"], r["vocab"], r["hidden"]), {})[r["variant"]] = r
    wins: dict[float, bool] = {}
    for (n, _v, h), by in cells.items():
        core, kernel = by.get("core"), by.get("greta-kernel")
        if not (core and kernel) or n / h > DELEGATE_MAX_N_PER_H:
            continue
        wins[n / h] = wins.get(n / h, True) and core["ms"] < kernel["ms"]
    best = None
    for ratio in sorted(wins):
        if not wins[ratio]:
            break
        best = ratio
    return best


def plot(path: Path, summary: list[dict[str, Any]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hiddens = sorted({s["hidden"] for s in summary})
    fig, axes = plt.subplots(2, len(hiddens), figsize=(6 * len(hiddens), 7), squeeze=False)
    for j, h in enumerate(hiddens):
        for v in sorted({s["vocab"] for s in summary if s["hidden"] == h}):
            pts = [s for s in summary if s["hidden"] == h and s["vocab"] == v]
            for i, key in enumerate(("greta_vs_core", "greta_vs_liger_mem")):
                xs = [s["tokens"] for s in pts if key in s]
                ys = [s[key] for s in pts if key in s]
                if xs:
                    axes[i][j].plot(xs, ys, marker="o", label=f"vocab {v}")
        axes[0][j].set_title(f"hidden {h}: GRETA time / fastest torch core", fontsize=9)
        axes[1][j].set_title(f"hidden {h}: GRETA extra memory / Liger's", fontsize=9)
        for i, line in ((0, 1 + TIME_TOL), (1, 1 + MEM_TOL)):
            axes[i][j].axhline(line, color="grey", linestyle="--", linewidth=0.8)
            axes[i][j].set_xscale("log", base=2)
            axes[i][j].set_xlabel("tokens")
            axes[i][j].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="result folder")
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    parser.add_argument("--vocabs", default=",".join(map(str, VOCABS)))
    parser.add_argument("--hiddens", default=",".join(map(str, HIDDENS)))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument(
        "--budget-s", type=float, default=360.0,
        help="start no new cell after this many seconds (default 360)",
    )  # fmt: skip
    parser.add_argument("--append", action="store_true", help="keep the rows already in --out")
    parser.add_argument(
        "--rounds", type=int, default=1,
        help="time each cell's variants this many times, interleaved; the median counts",
    )  # fmt: skip
    add_grid_options(parser, "lce_grid.json", "every GRETA variant", "cell and variant")
    parser.add_argument(
        "--device", default="cuda", choices=("cuda", "cpu"),
        help="cpu: the format check on tiny shapes (no memory columns, plain timings)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: expected at least 1")
    try:
        override = config_override(args.config)
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    if args.merge:
        return run_merge(parser, merge, args.out, args.merge)
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(
            f"unknown variant(s): {', '.join(unknown)}; expected some of {', '.join(VARIANTS)}"
        )

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("lce_grid: needs a CUDA/ROCm GPU (--device cpu: the format check)", file=sys.stderr)
        return 2
    from greta_core.bench.metadata import collect, command_line
    from greta_core.ops.linear_cross_entropy import core_api

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    meta = collect("lce_grid", args.device)
    with contextlib.suppress(Exception):
        from importlib.metadata import version

        meta["versions"]["liger_kernel"] = version("liger-kernel")
    meta["torch_core_api"] = core_api()
    meta["time_tol"], meta["mem_tol"] = TIME_TOL, MEM_TOL
    meta["config"] = override
    command = command_line("bench/lce_grid.py", sys.argv[1:] if argv is None else argv, out / "x")
    rows: list[dict[str, Any]] = []
    previous = out / "lce_grid.json"
    cells = sorted(
        (
            (n, h, v)
            for n in _ints(args.tokens)
            for h in _ints(args.hiddens)
            for v in _ints(args.vocabs)
        ),
        key=lambda c: c[0] * c[1] * c[2],
    )
    if args.append and previous.is_file():
        keep = {(n, v, h) for n, h, v in cells}
        rows = [
            r for r in json.loads(previous.read_text())["rows"]
            if (r["tokens"], r["vocab"], r["hidden"]) not in keep
        ]  # fmt: skip
    t_start = time.time()
    skipped_cells = []
    for n, h, v in cells:
        if time.time() - t_start > args.budget_s:
            skipped_cells.append(f"{n}x{h}x{v}")
            continue
        t0 = time.time()
        with overridden(override):
            rows += run_cell(n, h, v, variants, args.device, args.rounds)
        _write(out, _document(meta, command, rows, skipped_cells))
        print(f"cell {n}x{h}x{v}: {time.time() - t0:.1f} s", flush=True)
    if skipped_cells:
        print(f"not run (--budget-s {args.budget_s:.0f}): {', '.join(skipped_cells)}")
    return finish(out, meta, command, rows, skipped_cells)


def _write(out: Path, doc: dict[str, Any]) -> None:
    from greta_core.bench.report import write_csv, write_json

    write_json(out / "lce_grid.json", doc)
    write_csv(out / "lce_grid.csv", doc["rows"], FIELDS)
    write_csv(out / "lce_grid_summary.csv", doc["summary"], SUMMARY_FIELDS)


def _document(
    meta: dict[str, Any], command: str, rows: list[dict[str, Any]], not_run: list[str]
) -> dict[str, Any]:
    return {"metadata": meta, "command": command, "rows": rows, "summary": summarize(rows),
            "not_run_budget": not_run, "suggested_N_per_H_max": suggested_threshold(rows)}  # fmt: skip


def finish(
    out: Path, meta: dict[str, Any], command: str, rows: list[dict[str, Any]], not_run: list[str]
) -> int:
    """Write the grid's files and PNG and print its tables."""
    doc = _document(meta, command, rows, not_run)
    _write(out, doc)
    summary = doc["summary"]
    try:
        plot(
            out / "lce_grid.png", summary, f"linear cross-entropy fwd+bwd ({meta.get('gpu_name')})"
        )
    except Exception as exc:  # matplotlib missing: the numbers are written already
        print(f"no PNG: {exc.__class__.__name__}: {exc}", file=sys.stderr)
    print(f"\n{'tokens':>6} {'hidden':>6} {'vocab':>6} {'variant':22s} {'status':7s} "
          f"{'ms':>8} {'GiB':>6} {'loss_err':>8} {'dw_err':>8} impl")  # fmt: skip
    for r in rows:
        print(
            f"{r['tokens']:6d} {r['hidden']:6d} {r['vocab']:6d} {r['variant']:22s} "
            f"{r['status']:7s} {r.get('ms', math.nan):8.2f} {r.get('extra_gib', math.nan):6.2f} "
            f"{r.get('loss_rel_err', math.nan):8.1e} {r.get('dw_rel_err', math.nan):8.1e} "
            f"{r.get('impl', r.get('reason', ''))}"
        )
    print(
        f"\n{'tokens':>6} {'hidden':>6} {'vocab':>6} {'impl':18s} {'t/core':>7} {'mem/liger':>9} verdict"
    )
    for s in summary:
        print(
            f"{s['tokens']:6d} {s['hidden']:6d} {s['vocab']:6d} {s.get('greta_impl') or '-':18s} "
            f"{s.get('greta_vs_core', math.nan):7.2f} {s.get('greta_vs_liger_mem', math.nan):9.2f} "
            f"{s['verdict']}"
        )
    print(f"suggested N_per_H_max for torch's unchunked path: {doc['suggested_N_per_H_max']}")
    return 0


def merge(out: Path, sources: list[Path]) -> int:
    """--merge: `out`'s grid (where there is one) and then each source's rows, a later row
    replacing an earlier one of the same cell and variant; summary, files and PNG anew."""
    from greta_core.bench.report import merge_grid

    def cell(r: dict[str, Any]) -> str:
        return f"{r['tokens']}x{r['hidden']}x{r['vocab']}"

    doc = merge_grid(out / "lce_grid.json", sources, "bench/lce_grid.py",
                     lambda r: (cell(r), r["variant"]), cell)  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    return finish(out, doc["metadata"], doc["command"], doc["rows"], doc["not_run_budget"])


if __name__ == "__main__":
    sys.exit(main())
