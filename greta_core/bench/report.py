"""Derived numbers (bandwidth, FLOP/s, ratios) and the result files: CSV, JSON, PNG."""

from __future__ import annotations

import csv
import itertools
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from greta_core.errors import BenchError

Row = dict[str, Any]

FIELDS: tuple[str, ...] = (
    "op",
    "shape",
    "dtype",
    "impl",
    "status",
    "reason",
    "implementation_ran",
    "median_ms",
    "gbps",
    "tflops",
    "pct_copy_bw",
    "pct_matmul_peak",
    "speedup_vs_vendor",
    "speedup_vs_compile",
    "vendor_best",
    "check_rel_err",
    "bound",
    "bytes_moved",
    "flops",
    "input_sets",
    "timing_method",
    "note",
)
OVERHEAD_FIELDS: tuple[str, ...] = (
    "binding",
    "op",
    "input",
    "status",
    "reason",
    "implementation_ran",
    "host_us_per_call",
    "calls",
)
IMPL_ORDER: tuple[str, ...] = ("greta", "vendor", "torch.compile")


def is_vendor(impl: str) -> bool:
    return impl == "vendor" or impl.startswith("vendor:")


def _case_key(row: Row) -> tuple[str, str, str]:
    return (row["op"], row["shape"], row["dtype"])


def derive(rows: list[Row], ceilings: dict[str, Any]) -> list[Row]:
    """Fill rates, percent of the measured ceilings and speedups into the timed rows.

    Speedups are other / this: above 1 means this implementation is faster. The vendor
    time of a case is its fastest vendor variant (attention: the best SDPA backend).
    """
    copy_gbps = (ceilings.get("copy") or {}).get("gbps")
    matmul_tflops = (ceilings.get("matmul") or {}).get("tflops")
    out = [dict(r) for r in rows]
    cases: dict[tuple[str, str, str], list[Row]] = {}
    for row in out:
        cases.setdefault(_case_key(row), []).append(row)
    for group in cases.values():
        ok = [r for r in group if r["status"] == "ok" and r.get("median_ms")]
        vendors = [r for r in ok if is_vendor(r["impl"])]
        best_vendor = min(vendors, key=lambda r: r["median_ms"]) if vendors else None
        compiled = next((r for r in ok if r["impl"] == "torch.compile"), None)
        for row in group:
            row["vendor_best"] = best_vendor["impl"] if best_vendor else None
            ms = row.get("median_ms")
            if row["status"] != "ok" or not ms:
                continue
            seconds = ms * 1e-3
            row["gbps"] = row["bytes_moved"] / seconds / 1e9
            row["tflops"] = row["flops"] / seconds / 1e12 if row["flops"] else None
            row["pct_copy_bw"] = 100 * row["gbps"] / copy_gbps if copy_gbps else None
            if row["bound"] == "compute" and row["tflops"] and matmul_tflops:
                row["pct_matmul_peak"] = 100 * row["tflops"] / matmul_tflops
            if best_vendor:
                row["speedup_vs_vendor"] = best_vendor["median_ms"] / ms
            if compiled:
                row["speedup_vs_compile"] = compiled["median_ms"] / ms
    return out


def _csv_value(value: Any) -> Any:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "" if value is None else value


def write_csv(path: Path, rows: Iterable[Row], fields: tuple[str, ...]) -> None:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(fields), extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _csv_value(row.get(k)) for k in fields})


def write_json(path: Path, document: dict[str, Any]) -> None:
    """`document` as indented JSON at `path`, its folder made first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, sort_keys=False, default=str) + "\n")


def impl_rank(impl: str) -> tuple[int, str]:
    base = "vendor" if is_vendor(impl) else impl
    return (IMPL_ORDER.index(base) if base in IMPL_ORDER else len(IMPL_ORDER), impl)


def plot(path: Path, rows: list[Row], ceilings: dict[str, Any], title: str) -> None:
    """Grouped bars per case and implementation: GB/s for memory-bound ops, TFLOP/s for
    compute-bound ones, with the measured ceiling drawn as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("memory", "gbps", "achieved GB/s", (ceilings.get("copy") or {}).get("gbps"), "copy"),
        (
            "compute",
            "tflops",
            "achieved TFLOP/s",
            (ceilings.get("matmul") or {}).get("tflops"),
            "matmul",
        ),
    ]
    fig, axes = plt.subplots(2, 1, figsize=(13, 9))
    # One colour per implementation across both panels.
    all_impls = sorted({r["impl"] for r in rows}, key=impl_rank)
    palette = plt.get_cmap("tab10")
    colours = {impl: palette(i % 10) for i, impl in enumerate(all_impls)}
    for ax, (bound, metric, label, ceiling, ceiling_name) in zip(axes, panels, strict=True):
        selected = [r for r in rows if r["bound"] == bound]
        case_keys = list(dict.fromkeys(_case_key(r) for r in selected))
        drawn = [r for r in selected if r["status"] == "ok" and r.get(metric)]
        impls = sorted({r["impl"] for r in drawn}, key=impl_rank)
        missing = sorted({r["impl"] for r in selected} - set(impls), key=impl_rank)
        width = 0.8 / max(len(impls), 1)
        for i, impl in enumerate(impls):
            xs, heights = [], []
            for j, key in enumerate(case_keys):
                row = next((r for r in drawn if _case_key(r) == key and r["impl"] == impl), None)
                if row:
                    xs.append(j + (i - (len(impls) - 1) / 2) * width)
                    heights.append(row[metric])
            ax.bar(xs, heights, width=width, label=impl, color=colours[impl])
        if ceiling:
            ax.axhline(ceiling, color="black", linestyle="--", linewidth=1)
            ax.annotate(
                f"{ceiling_name} ceiling {ceiling:.4g}",
                xy=(0.995, ceiling),
                xycoords=("axes fraction", "data"),
                ha="right",
                va="bottom",
                fontsize=8,
            )
        ax.set_xticks(range(len(case_keys)))
        ax.set_xticklabels([f"{op}\n{shape}" for op, shape, _ in case_keys], fontsize=7)
        ax.set_ylabel(label)
        if not case_keys:
            ax.text(0.5, 0.5, "no case", ha="center", va="center", transform=ax.transAxes)
        if missing:
            ax.set_title(
                "no bars for: " + ", ".join(missing) + " (skipped or failed: see CSV 'reason')",
                fontsize=7,
                loc="left",
            )
        if impls:
            ax.legend(fontsize=7, ncol=min(len(impls), 6))
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary_table(rows: list[Row], timings: bool = True) -> str:
    """Compact text table: one line per case and implementation; `timings=False` (a CPU
    run: interpreter time, not speed) shows what ran and leaves the numbers out."""
    if not timings:
        lines = [f"{'case':<52} {'impl':<28} {'status':<8} ran"]
        for r in rows:
            case = f"{r['op']} {r['shape']}"[:52]
            detail = r.get("implementation_ran") or r.get("reason") or ""
            lines.append(f"{case:<52} {r['impl']:<28} {r['status']:<8} {str(detail)[:40]}")
        return "\n".join(lines)
    lines = [
        f"{'case':<52} {'impl':<28} {'status':<8} {'ms':>9} {'GB/s':>8} {'TFLOP/s':>8} {'vs vendor':>9}"
    ]
    for r in rows:
        case = f"{r['op']} {r['shape']}"[:52]
        if r["status"] != "ok":
            lines.append(
                f"{case:<52} {r['impl']:<28} {r['status']:<8} {(r.get('reason') or '')[:60]}"
            )
            continue

        def fmt(value: Any, spec: str) -> str:
            return format(value, spec) if isinstance(value, (int, float)) else "-"

        lines.append(
            f"{case:<52} {r['impl']:<28} {r['status']:<8} {fmt(r['median_ms'], '9.4f')} "
            f"{fmt(r.get('gbps'), '8.1f')} {fmt(r.get('tflops'), '8.1f')} "
            f"{fmt(r.get('speedup_vs_vendor'), '9.2f')}"
        )
    return "\n".join(lines)


# What must agree between runs whose rows are merged into one grid.
SAME_STACK = ("gpu_name", "torch", "triton")


def _stack(metadata: dict[str, Any]) -> dict[str, Any]:
    """The SAME_STACK values of a run: the GPU's name from the metadata, the rest versions."""
    versions = {**(metadata.get("versions") or {}), "gpu_name": metadata.get("gpu_name")}
    return {k: versions.get(k) for k in SAME_STACK}


def check_same_stack(metadatas: list[dict[str, Any]]) -> None:
    """BenchError where these runs' metadata differ in GPU, torch or Triton: their numbers
    would not compare."""
    first = _stack(metadatas[0])
    for metadata in metadatas[1:]:
        other = _stack(metadata)
        if other != first:
            diff = ", ".join(
                f"{k} {first[k]} vs {other[k]}" for k in SAME_STACK if first[k] != other[k]
            )
            raise BenchError(f"refusing to merge runs on different stacks: {diff}")


def merge_runs(
    documents: list[dict[str, Any]], key: Callable[[Row], Any]
) -> tuple[list[Row], dict[str, Any]]:
    """(rows, metadata) of one grid measured over several runs of its script: a later run's
    row replaces an earlier one with the same `key` (in the earlier one's place); the
    metadata is the first run's, with ``merged`` listing every run's command, config,
    commit, tree, date and versions (a later run's files and its other packages can differ
    from the first's: its tree is what it ran). Raises BenchError where the runs differ in
    GPU, torch or Triton."""
    if not documents:
        raise BenchError("nothing to merge")
    check_same_stack([doc["metadata"] for doc in documents])
    rows: dict[Any, Row] = {}
    for doc in documents:
        for row in doc["rows"]:
            rows[key(row)] = row
    metadata = dict(documents[0]["metadata"])
    metadata["merged"] = [run for doc in documents for run in merged_runs(doc)]
    return list(rows.values()), metadata


def merged_runs(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs a grid document holds: those its own ``merged`` lists (a grid merged
    before), else the one run it is (command, config, commit, tree, date, versions)."""
    if doc["metadata"].get("merged"):
        return list(doc["metadata"]["merged"])
    meta = doc["metadata"]
    return [{"command": doc.get("command"), "config": meta.get("config"),
             "commit": meta.get("commit"), "tree": meta.get("tree"), "date": meta.get("date"),
             "versions": meta.get("versions"), "rows": len(doc["rows"])}]  # fmt: skip


def load_runs(own: Path, sources: list[Path]) -> list[dict[str, Any]]:
    """The grid JSON at `own` (where it exists) and then each of `sources`: the runs to
    merge into `own`'s grid, in order. Raises BenchError naming a source that is missing or
    not a grid."""
    docs = [json.loads(own.read_text())] if own.is_file() else []
    for path in sources:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise BenchError(f"{path}: {exc.__class__.__name__}: {exc}") from None
        if not isinstance(doc, dict) or not {"metadata", "rows"} <= doc.keys():
            raise BenchError(f"{path}: not a grid's JSON (no metadata and rows)")
        docs.append(doc)
    return docs


def merge_grid(
    own: Path, sources: list[Path], script: str, key: Callable[[Row], Any],
    unit: Callable[[Row], str], union: tuple[str, ...] = (),
) -> dict[str, Any]:  # fmt: skip
    """A grid script's ``--merge``: the document (metadata, command, rows, not_run_budget)
    of `own`'s grid (where it exists) with each of `sources` folded in, a later row replacing
    an earlier one of the same `key`. The command is the first run's; ``merge_command``
    shows the runs as ``<runK>``, the K-th entry of ``metadata.merged`` (the files merged
    were on the machine that merged them). A budget's "not run" `unit` that a later run
    measured is dropped. The metadata's mappings named in `union` (a run's families, say)
    hold every run's entries."""
    docs = load_runs(own, sources)
    rows, metadata = merge_runs(docs, key)
    for name in union:
        metadata[name] = {k: v for doc in docs for k, v in doc["metadata"].get(name, {}).items()}
    # <runK>: the K-th entry of metadata.merged, where that source's runs begin (any doc,
    # `own` or a source, may itself be a merge of several).
    starts = itertools.accumulate((len(merged_runs(d)) for d in docs), initial=1)
    runs = " ".join(f"<run{k}>" for k in list(starts)[len(docs) - len(sources) : len(docs)])
    metadata["merge_command"] = f"python {script} --out <out> --merge {runs}"
    ran = {unit(row) for row in rows}
    not_run = sorted({u for doc in docs for u in doc.get("not_run_budget", [])} - ran)
    return {"metadata": metadata, "command": docs[0]["command"], "rows": rows,
            "not_run_budget": not_run}  # fmt: skip
