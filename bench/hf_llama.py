#!/usr/bin/env python3
"""A random-init Hugging Face Llama, side by side: vanilla / Liger-Kernel / GRETA.

Per shape and variant: train step time (forward with labels + backward; the median of the
timed steps, their mean and each step are kept too), peak memory of
the train steps, eager greedy decode tokens/s at batch 1, and the logits' error against
vanilla on one probe batch. Variants:

- ``vanilla``: transformers as shipped (SDPA attention);
- ``liger``: ``apply_liger_kernel_to_llama()`` (skipped when liger_kernel is not importable);
- ``greta``: ``apply_greta(model)`` (every kernel; in training, attention follows the
  arch's config table, which picks SDPA where its backward is faster);
- ``greta-attn``: ``apply_greta(model, attention="always")`` (GRETA's attention in training too);
- ``greta-sdpa``: ``apply_greta(model, attention=False)`` (attention left to SDPA).

On a GPU each variant runs in its own process (clean patches, its own peak memory, a crash
costs one row); rows are written to ``<out>/hf_llama.{json,csv}`` as they arrive, the PNG
at the end. ``--quick`` is the < 3 minute run (the 1.0 B shape only, few steps);
``--tiny`` is a seconds-long CPU smoke test (in one process).

    python bench/hf_llama.py --quick                  # GPU only; H100: bench/results/h100/hf_llama/
    python bench/hf_llama.py --shapes llama-1b-8l                 # one shape per command
    python bench/hf_llama.py --shapes llama3-8b-4l --append       # adds its rows
    python bench/hf_llama.py --tiny --out hf_llama_smoke
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, "") and not any(Path(p, "greta_core").is_dir() for p in sys.path):
    sys.path.insert(0, str(ROOT))  # run from a source checkout without installing

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling hf_grid.py
import hf_grid  # noqa: E402  (its model building and tokens: one place for both benches)

VARIANTS = ("vanilla", "liger", "greta", "greta-attn", "greta-sdpa")
FIELDS = (
    "shape", "variant", "status", "reason", "params", "batch", "seq",
    "train_step_ms", "train_step_mean_ms", "peak_mem_gib", "peak_fwd_gib", "mem_after_fwd_gib", "peak_bwd_gib",
    "decode_tok_s", "decode_all_tok_s", "decode_tokens",
    "loss", "logits_max_rel_err", "logits_rel_l2_err", "implementations",
)  # fmt: skip


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    batch: int
    seq: int

    def config(self) -> Any:
        from transformers import LlamaConfig

        return LlamaConfig(
            hidden_size=self.hidden,
            intermediate_size=self.intermediate,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            vocab_size=self.vocab,
            max_position_embeddings=max(self.seq, 256) * 2,
            tie_word_embeddings=False,
            rope_theta=500000.0,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        )


SHAPES = {
    # The model: 1.0 B parameters (8 Llama-3.2-1B layers, untied 128k vocab).
    "llama-1b-8l": Shape("llama-1b-8l", 2048, 8192, 8, 32, 8, 128256, 4, 2048),
    # Llama-3-8B's layer shapes (4096 / 14336 / GQA 32:8 / head_dim 128), 4 layers: fits.
    "llama3-8b-4l": Shape("llama3-8b-4l", 4096, 14336, 4, 32, 8, 128256, 4, 2048),
    # CPU smoke test.
    "tiny": Shape("tiny", 64, 128, 2, 4, 2, 128, 2, 16),
}


@dataclass(frozen=True)
class Settings:
    warmup: int
    steps: int
    decode_tokens: int
    prompt: int
    probe_seq: int


# Timed generate calls per variant (after one warm-up generate of the same length).
DECODE_RUNS = 3

FULL = Settings(warmup=2, steps=10, decode_tokens=128, prompt=32, probe_seq=256)
QUICK = Settings(warmup=2, steps=10, decode_tokens=32, prompt=32, probe_seq=128)
TINY = Settings(warmup=1, steps=1, decode_tokens=4, prompt=4, probe_seq=8)


# --- one variant (worker) -------------------------------------------------------------------


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _build(shape: Shape, variant: str, device: str, dtype: Any) -> Any:
    """The model for `variant`, same weights for every variant (seeded init on the device)."""
    from transformers import LlamaForCausalLM

    return hf_grid.build_model(
        LlamaForCausalLM, shape.config(), variant, device, dtype, "apply_liger_kernel_to_llama"
    )


def _tokens(shape: Shape, batch: int, seq: int, seed: int, device: str) -> Any:
    return hf_grid.tokens(shape.vocab, batch, seq, seed, device)


def _memory_split(model: Any, batch: Any) -> dict[str, float]:
    """Where the train step's peak is: peak while forward runs, what the forward leaves
    for the backward (activations, saved gradients), and the peak of the backward."""
    import torch

    gib = 2**30
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    out = model(batch, labels=batch)
    split = {
        "peak_fwd_gib": torch.cuda.max_memory_allocated() / gib,
        "mem_after_fwd_gib": torch.cuda.memory_allocated() / gib,
    }
    torch.cuda.reset_peak_memory_stats()
    out.loss.backward()
    torch.cuda.synchronize()
    split["peak_bwd_gib"] = torch.cuda.max_memory_allocated() / gib
    model.zero_grad(set_to_none=True)
    return split


def _profile_step(step: Any, path: Path) -> None:
    """One train step under torch.profiler, as JSON: the GPU kernels by total time; how long
    the GPU sat idle inside the step (the host did not keep it fed); the host ops by self
    CPU time (the profiler's own overhead inflates these: compare variants, not absolutes).
    """
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    averages = prof.key_averages()
    events = [e for e in averages if e.device_time_total > 0]
    events.sort(key=lambda e: e.device_time_total, reverse=True)
    total = sum(e.device_time_total for e in events)
    rows = [
        {"kernel": e.key[:160], "calls": e.count, "ms": e.device_time_total / 1e3}
        for e in events[:40]
    ]
    spans = sorted(
        (e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.device_type == DeviceType.CUDA and e.time_range.end > e.time_range.start
    )
    busy, idle, last_end = 0.0, 0.0, None
    for start, end in spans:
        if last_end is not None and start > last_end:
            idle += start - last_end
        if last_end is None or end > last_end:
            busy += end - max(start, last_end if last_end is not None else start)
            last_end = end
    host = sorted(averages, key=lambda e: e.self_cpu_time_total, reverse=True)
    host_rows = [
        {"op": e.key[:120], "calls": e.count, "self_cpu_ms": e.self_cpu_time_total / 1e3,
         "cpu_ms": e.cpu_time_total / 1e3}
        for e in host[:30]
    ]  # fmt: skip
    doc = {
        "total_ms": total / 1e3,
        "gpu_busy_ms": busy / 1e3,
        "gpu_idle_between_kernels_ms": idle / 1e3,
        "top": rows,
        "host_top": host_rows,
    }
    from greta_core.bench.report import write_json

    write_json(path, doc)


def run_variant(
    shape: Shape,
    variant: str,
    settings: Settings,
    device: str,
    probe: Path | None,
    profile: Path | None = None,
) -> dict[str, Any]:
    """Measure one variant; returns its row (status "ok")."""
    import torch

    from greta_core import observe

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = _build(shape, variant, device, dtype)
    params = sum(p.numel() for p in model.parameters())
    row: dict[str, Any] = {"params": params}
    observe.reset()  # implementations seen by this variant only

    # Logits of one probe batch (eval mode computes logits for every variant).
    ids = _tokens(shape, 1, settings.probe_seq, 1, device)
    model.eval()
    with torch.no_grad():
        logits = model(ids).logits.float()
    if probe is not None:
        if variant == "vanilla":
            torch.save(logits.cpu(), probe)
        elif probe.is_file():
            ref = torch.load(probe).to(logits.device)
            diff = (logits - ref).abs()
            row["logits_max_rel_err"] = (diff.max() / ref.abs().max()).item()
            row["logits_rel_l2_err"] = ((logits - ref).norm() / ref.norm()).item()
    del logits

    # Train step: forward with labels + backward (no optimizer step), same batch each time.
    model.train()
    batch = _tokens(shape, shape.batch, shape.seq, 2, device)

    def step() -> float:
        out = model(batch, labels=batch)
        out.loss.backward()
        model.zero_grad(set_to_none=True)
        return out.loss.item()

    for _ in range(settings.warmup):
        step()
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    _sync(device)
    times = []
    for _ in range(settings.steps):  # step() ends in loss.item(): each step is synchronised
        t0 = time.perf_counter()
        loss = step()
        times.append((time.perf_counter() - t0) * 1e3)
    # The median step (the device method's rule): one slow step (an allocator refill after
    # empty_cache, a host hiccup) moves the mean of 10 by several percent, not the median.
    row["train_step_ms"] = statistics.median(times)
    row["train_step_mean_ms"] = statistics.fmean(times)
    row["train_step_all_ms"] = [round(t, 2) for t in times]
    row["loss"] = loss
    if device == "cuda":
        row["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
        row.update(_memory_split(model, batch))
        if profile is not None:
            _profile_step(step, profile)

    # Eager greedy decode, batch 1, in steady state. The warm-up generates the same number
    # of tokens, so every cache length the timed runs meet has been seen once: SDPA's cuDNN
    # backend builds a plan per new sequence length (about 50 ms each on the H100), which a
    # shorter warm-up left inside the timed region (4-6x slower vanilla decode, a bench
    # artefact in GRETA's favour). The median of DECODE_RUNS generates is the row's number.
    model.eval()
    prompt = _tokens(shape, 1, settings.prompt, 3, device)
    n = settings.decode_tokens
    kw = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
    rates = []
    with torch.no_grad():
        model.generate(prompt, **kw)  # warm: every cache length once
        for _ in range(DECODE_RUNS):
            _sync(device)
            t0 = time.perf_counter()
            out = model.generate(prompt, **kw)
            _sync(device)
            rates.append((out.shape[1] - prompt.shape[1]) / (time.perf_counter() - t0))
    row["decode_tok_s"] = statistics.median(rates)
    row["decode_all_tok_s"] = [round(r, 2) for r in rates]
    row["decode_tokens"] = n
    row["implementations"] = json.dumps(observe.implementations_seen(), sort_keys=True)
    row["status"] = "ok"
    return row


def _skip_reason(variant: str, device: str) -> str:
    if variant == "liger":
        if device == "cpu":
            return "Liger-Kernel's Triton kernels need a GPU"
        try:
            import liger_kernel.transformers  # noqa: F401
        except Exception as exc:  # not installed, or no GPU build of its deps
            return f"liger_kernel not importable: {exc.__class__.__name__}: {exc}"
    return ""


def worker_main(args: argparse.Namespace) -> int:
    """Subprocess entry: one (shape, variant); prints one JSON row."""
    shape, settings = SHAPES[args.shape], _settings(args)
    row = {"shape": shape.name, "variant": args.variant, "batch": shape.batch, "seq": shape.seq}
    reason = _skip_reason(args.variant, args.device)
    if reason:
        row.update(status="skipped", reason=reason)
    else:
        try:
            row.update(
                run_variant(
                    shape, args.variant, settings, args.device, args.probe, args.profile_file
                )
            )
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            row.update(status="failed", reason=f"{exc.__class__.__name__}: {exc}"[:500])
    print("ROW " + json.dumps(row), flush=True)
    return 0


# --- the driver ------------------------------------------------------------------------------


def _settings(args: argparse.Namespace) -> Settings:
    return TINY if args.tiny else QUICK if args.quick else FULL


def _device_tag(device: str) -> str:
    if device == "cpu":
        return "cpu"
    import torch

    name = torch.cuda.get_device_name(0).lower()
    for tag in ("h100", "h200", "a100", "mi300x", "mi250"):
        if tag in name:
            return tag
    return "".join(c if c.isalnum() else "_" for c in name).strip("_") or "gpu"


def _in_subprocess(args: argparse.Namespace, shape: str, variant: str, probe: Path) -> dict:
    cmd = [
        sys.executable, str(Path(__file__).resolve()), "--worker", "--shape", shape,
        "--variant", variant, "--device", args.device, "--probe", str(probe),
    ] + (["--quick"] if args.quick else [])  # fmt: skip
    if args.profile:
        cmd += ["--profile-file", str(args.out_dir / f"profile_{shape}_{variant}.json")]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=args.timeout, env=env, check=False
        )
    except subprocess.TimeoutExpired:
        return {"status": "failed", "reason": f"timed out after {args.timeout} s"}
    for line in proc.stdout.splitlines():
        if line.startswith("ROW "):
            return json.loads(line[4:])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return {"status": "failed", "reason": f"exit {proc.returncode}: {' | '.join(tail)}"[:500]}


def _in_process(args: argparse.Namespace, shape: str, variant: str, probe: Path) -> dict:
    reason = _skip_reason(variant, args.device)
    if reason:
        return {"status": "skipped", "reason": reason}
    try:
        return run_variant(SHAPES[shape], variant, _settings(args), args.device, probe)
    except Exception as exc:
        return {"status": "failed", "reason": f"{exc.__class__.__name__}: {exc}"[:500]}
    finally:
        from greta_core.transformers import apply as greta_apply
        from greta_core.transformers import revert_greta

        for key in greta_apply.patched_targets():
            revert_greta(key)


def _write(out: Path, meta: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    from greta_core.bench.report import write_csv, write_json

    write_json(out / "hf_llama.json", {"metadata": meta, "rows": rows})
    write_csv(out / "hf_llama.csv", rows, FIELDS)


def plot(path: Path, rows: list[dict[str, Any]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (
        ("train_step_ms", "train step (ms, lower is better)"),
        ("peak_mem_gib", "peak memory (GiB, lower is better)"),
        ("decode_tok_s", "eager decode, batch 1 (tok/s, higher is better)"),
    )
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    variants = [v for v in VARIANTS if any(r["variant"] == v for r in rows)]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    width = 0.8 / max(len(variants), 1)
    for ax, (metric, label) in zip(axes, panels, strict=True):
        for i, variant in enumerate(variants):
            xs, hs = [], []
            for j, shape in enumerate(shapes):
                row = next((r for r in rows if r["shape"] == shape and r["variant"] == variant), {})
                if row.get("status") == "ok" and row.get(metric) is not None:
                    xs.append(j + (i - (len(variants) - 1) / 2) * width)
                    hs.append(row[metric])
            if xs:
                ax.bar(xs, hs, width=width, label=variant, color=f"C{VARIANTS.index(variant)}")
        ax.set_xticks(range(len(shapes)))
        ax.set_xticklabels(shapes, fontsize=8)
        ax.set_title(label, fontsize=9)
    axes[0].legend(fontsize=8)
    missing = [
        v for v in variants if not any(r["variant"] == v and r["status"] == "ok" for r in rows)
    ]
    if missing:
        title += f" (no bars: {', '.join(missing)}: skipped or failed, see the CSV)"
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        help="result dir (default bench/results/<gpu>/hf_llama; --tiny: under the user cache)",
    )
    parser.add_argument("--quick", action="store_true", help="< 3 minutes on an H100")
    parser.add_argument("--tiny", action="store_true", help="CPU smoke test (seconds)")
    parser.add_argument("--shapes", help=f"comma list of {', '.join(SHAPES)}")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if visible)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per variant")
    parser.add_argument(
        "--append", action="store_true", help="keep the rows already in <out>/hf_llama.json"
    )
    parser.add_argument("--in-process", action="store_true", help="no subprocess per variant")
    parser.add_argument(
        "--profile", action="store_true",
        help="also profile one train step per variant: <out>/profile_<shape>_<variant>.json",
    )  # fmt: skip
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--profile-file", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--shape", help=argparse.SUPPRESS)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--probe", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    import torch

    if args.device is None:
        args.device = "cpu" if args.tiny or not torch.cuda.is_available() else "cuda"
    if args.worker:
        return worker_main(args)
    from greta_core.bench.metadata import collect

    if args.shapes:
        shapes = args.shapes.split(",")
    else:
        shapes = ["tiny"] if args.tiny else ["llama-1b-8l"] if args.quick else list(SHAPES)[:2]
    variants = [v for v in args.variants.split(",") if v]
    unknown = [s for s in shapes if s not in SHAPES] + [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown shape/variant: {', '.join(unknown)}")
    if "vanilla" in variants:  # the logits reference runs first
        variants = ["vanilla", *(v for v in variants if v != "vanilla")]
    # A --tiny smoke run is no result to commit: unless --out names a folder it goes under
    # the user's cache, never into the checkout.
    if args.out is not None:
        out = args.out
    elif args.tiny:
        from greta_core.bench.runner import default_out

        stamped = default_out()  # <cache>/greta/bench/<date-time>
        out = stamped.parent.parent / "hf_llama" / stamped.name
    else:
        out = ROOT / "bench" / "results" / _device_tag(args.device) / "hf_llama"
    out.mkdir(parents=True, exist_ok=True)
    args.out_dir = out
    preset = "tiny" if args.tiny else "quick" if args.quick else "full"
    meta = collect(preset, args.device)
    meta["settings"] = asdict(_settings(args))
    meta["shapes"] = {s: asdict(SHAPES[s]) for s in shapes}
    with contextlib.suppress(Exception):
        import transformers

        meta["versions"]["transformers"] = transformers.__version__
    in_process = args.in_process or args.tiny
    rows: list[dict[str, Any]] = []
    previous = out / "hf_llama.json"
    if args.append and previous.is_file():
        # Another shape measured by an earlier command (one command per shape fits a
        # device time limit); rows of the shapes measured now are replaced.
        rows = [r for r in json.loads(previous.read_text())["rows"] if r["shape"] not in shapes]
    for shape in shapes:
        probe = out / f".probe_logits_{shape}.pt"
        for variant in variants:
            t0 = time.time()
            run = _in_process if in_process else _in_subprocess
            row = {
                "shape": shape, "variant": variant,
                "batch": SHAPES[shape].batch, "seq": SHAPES[shape].seq,
                **run(args, shape, variant, probe),
            }  # fmt: skip
            rows.append(row)
            _write(out, meta, rows)  # incrementally: a later crash keeps these rows
            shown = {k: row.get(k) for k in ("train_step_ms", "peak_mem_gib", "decode_tok_s")}
            print(
                f"{shape:14s} {variant:11s} {row['status']:8s} {time.time() - t0:6.1f}s "
                f"{json.dumps(shown)} {row.get('reason', '')}",
                flush=True,
            )
        probe.unlink(missing_ok=True)
    written = ["hf_llama.json", "hf_llama.csv"]
    try:
        plot(out / "hf_llama.png", rows, f"HF Llama, random init ({meta.get('gpu_name') or 'CPU'})")
        written.append("hf_llama.png")
    except Exception as exc:  # matplotlib missing: the numbers are written already
        print(f"no PNG: {exc}", file=sys.stderr)
    print(f"wrote {', '.join(str(out / name) for name in written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
