#!/usr/bin/env python3
"""The Hugging Face grid: model families x regimes x variants, one command, one machine.

Families are random-init models shaped like the real ones (8 layers or fewer, bf16 on a GPU):
``llama`` (Llama-3.2-1B), ``qwen3`` (Qwen3-1.7B), ``mistral`` (Mistral-7B-v0.3, 4 layers),
``gemma`` (Gemma-2B: head_dim 256, multi-query). Regimes:

- ``train-b1s256``: forward with labels + backward, batch 1 x 256 tokens (host-bound);
- ``train-b4s2048``, ``train-b1s16384``: the same, GPU-bound;
- ``decode-b1``, ``decode-b8``: eager greedy ``generate`` (dynamic cache), batch 1 and 8;
- ``generate-static``: greedy ``generate`` with ``cache_implementation="static"`` (batch 1);
  the ``compile`` variant lets transformers compile the forward there (its own graph path),
  the others run it eagerly (``disable_compile=True``).

Variants: ``vanilla`` (transformers, SDPA), ``compile`` (``torch.compile(model)`` for
training; eager decode is not its regime and is skipped), ``liger`` (Liger-Kernel's
``apply_liger_kernel_to_<family>``), ``greta`` (``apply_greta(model)``), and the optional
``greta-attn`` / ``greta-sdpa`` (attention always GRETA's / never).

Per (family, variant) one process builds the model once (same seed: same weights) and runs
every requested regime: a crash or hang costs that process's rows only. Beside speed
(median train step ms, decode tokens/s) and peak memory per regime, each row carries
agreement with vanilla on one probe: the logits of a 256-token batch (eval), the loss and
the gradients of one training step (relative L2 error of the first layer's q_proj gradient,
largest relative error of any parameter's gradient norm). ``vanilla`` must have run for a
family (this command or an earlier one with the same --out) for these columns.

Writes ``<out>/hf_grid.json`` (metadata: stack versions, GPU, the families' configs),
``hf_grid.csv`` (a row per family x regime x variant), ``hf_grid_summary.csv`` (per family x
regime: GRETA against vanilla and the best peer, with the verdict) and ``hf_grid.png`` when
matplotlib is importable. Split it to fit a device call: ``--families``, ``--regimes``,
``--variants`` (``--append`` keeps the rows of earlier calls). ``--tiny`` is the CPU
format check (tiny configs, seconds, in one process). ``bench/hf_host_ab.py`` with the same
``--out`` measures the host-bound cells with both variants in one process; the summary's
verdict against vanilla then reads that ratio (``greta_vs_vanilla_interleaved``).

    python bench/hf_grid.py --out DIR --families llama --regimes train-b1s256,train-b4s2048
    python bench/hf_grid.py --out DIR --families qwen3 --append
    python bench/hf_grid.py --tiny --out DIR
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
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

VARIANTS = ("vanilla", "compile", "liger", "greta", "greta-attn", "greta-sdpa")
DEFAULT_VARIANTS = ("vanilla", "compile", "liger", "greta")
PEERS = ("compile", "liger")
FIELDS = (
    "family", "regime", "variant", "status", "reason", "params", "batch", "seq", "new_tokens",
    "ms", "ms_mean", "tok_s", "peak_gib", "first_s", "loss", "loss_rel_err",
    "logits_max_rel_err", "logits_rel_l2_err", "grad_rel_err", "grad_norm_max_rel_err",
    "implementations",
)  # fmt: skip
SUMMARY_FIELDS = (
    "family", "regime", "bound", "metric", "vanilla", "best_peer", "best_peer_value", "greta",
    "greta_vs_vanilla", "greta_vs_vanilla_interleaved", "greta_vs_best_peer", "greta_peak_gib",
    "liger_peak_gib", "verdict",
)  # fmt: skip
# bench/hf_host_ab.py's result, when it ran with the same --out: the host-bound cells with
# both variants in one process, which the verdict against vanilla then reads.
INTERLEAVED = "hf_host_ab.json"
# A GRETA time within 2% of the other's counts as equal (the median of 10-20 synchronised
# steps moves by about that between runs of the same variant on the H100).
TIME_TOL = 0.02
# Peak memory "at Liger's": within 2% (the caching allocator's rounding of a 7-20 GiB peak).
MEM_TOL = 0.02


@dataclass(frozen=True)
class Family:
    name: str
    config_class: str
    model_class: str
    liger: str  # liger_kernel.transformers function, class mode (before instantiation)
    config: dict[str, Any]
    shaped_like: str


FAMILIES = {
    f.name: f
    for f in (
        Family(
            "llama", "LlamaConfig", "LlamaForCausalLM", "apply_liger_kernel_to_llama",
            dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=8,
                 num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                 rope_theta=500000.0, tie_word_embeddings=False),
            "Llama-3.2-1B (8 of 16 layers, untied head)",
        ),
        Family(
            "qwen3", "Qwen3Config", "Qwen3ForCausalLM", "apply_liger_kernel_to_qwen3",
            dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=8,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                 vocab_size=151936, rope_theta=1000000.0, tie_word_embeddings=True),
            "Qwen3-1.7B (8 of 28 layers)",
        ),
        Family(
            "mistral", "MistralConfig", "MistralForCausalLM", "apply_liger_kernel_to_mistral",
            dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=4,
                 num_attention_heads=32, num_key_value_heads=8, vocab_size=32768,
                 rope_theta=1000000.0, sliding_window=None, tie_word_embeddings=False),
            "Mistral-7B-v0.3 (4 of 32 layers)",
        ),
        Family(
            "gemma", "GemmaConfig", "GemmaForCausalLM", "apply_liger_kernel_to_gemma",
            dict(hidden_size=2048, intermediate_size=16384, num_hidden_layers=8,
                 num_attention_heads=8, num_key_value_heads=1, head_dim=256,
                 vocab_size=256000, hidden_activation="gelu_pytorch_tanh",
                 tie_word_embeddings=True),
            "Gemma-2B (8 of 18 layers)",
        ),
    )
}  # fmt: skip
# --tiny: every family's kind of config at CPU size (its head_dim ratio kept for Gemma).
TINY_CONFIG = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, vocab_size=128,
)  # fmt: skip
TINY_OVERRIDES = {"qwen3": {"head_dim": 16}, "gemma": {"head_dim": 32, "num_key_value_heads": 1}}


@dataclass(frozen=True)
class Regime:
    name: str
    kind: str  # "train", "decode", "generate-static"
    batch: int
    seq: int  # train: tokens per row; decode/generate: the prompt
    new_tokens: int = 0
    warmup: int = 2
    steps: int = 10
    gpu_bound: bool = False


REGIMES = {
    r.name: r
    for r in (
        Regime("train-b1s256", "train", 1, 256, warmup=3, steps=20),
        Regime("train-b4s2048", "train", 4, 2048, warmup=2, steps=10, gpu_bound=True),
        Regime("train-b1s16384", "train", 1, 16384, warmup=2, steps=6, gpu_bound=True),
        Regime("decode-b1", "decode", 1, 32, new_tokens=64, steps=3),
        Regime("decode-b8", "decode", 8, 32, new_tokens=64, steps=3),
        Regime("generate-static", "generate-static", 1, 32, new_tokens=64, steps=3),
    )
}
TINY_REGIMES = {
    r.name: r
    for r in (
        Regime("train-b1s256", "train", 1, 16, warmup=1, steps=2),
        Regime("train-b4s2048", "train", 2, 16, warmup=1, steps=2, gpu_bound=True),
        Regime("train-b1s16384", "train", 1, 32, warmup=1, steps=2, gpu_bound=True),
        Regime("decode-b1", "decode", 1, 4, new_tokens=3, steps=1),
        Regime("decode-b8", "decode", 2, 4, new_tokens=3, steps=1),
        Regime("generate-static", "generate-static", 1, 4, new_tokens=3, steps=1),
    )
}
# The probe batch is train-b1s256's shape (1 x 256), so a compiled model's probe and that
# regime share one graph; logits are kept for its last PROBE_KEEP positions.
PROBE_SEQ, PROBE_KEEP = 256, 16
TINY_PROBE_SEQ = 16  # --tiny: likewise the tiny train-b1s256 batch
PROBE_GRAD_ROWS = 256  # rows of layer 0's q_proj gradient kept for the comparison


@dataclass
class Job:
    family: str
    variant: str
    regimes: list[str]
    device: str
    tiny: bool
    probe_dir: Path
    compile_backend: str
    extra: dict[str, Any] = field(default_factory=dict)


# --- one (family, variant): the worker ----------------------------------------------------------


def family_config(family: Family, tiny: bool) -> Any:
    import transformers

    kw = dict(family.config)
    if tiny:
        kw.update(TINY_CONFIG)
        kw.update(TINY_OVERRIDES.get(family.name, {}))
    kw.update(max_position_embeddings=32768, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return getattr(transformers, family.config_class)(**kw)


def build(family: Family, variant: str, device: str, dtype: Any, tiny: bool) -> Any:
    """The model for `variant`; the same weights for every variant (seeded init on the device)."""
    import transformers

    cls = getattr(transformers, family.model_class)
    return build_model(cls, family_config(family, tiny), variant, device, dtype, family.liger)


def build_model(cls: Any, config: Any, variant: str, device: str, dtype: Any, liger: str) -> Any:
    """`cls` from `config` in `variant` (Liger's `liger` patch in class mode, GRETA applied
    after), seeded on the device so every variant starts from the same weights."""
    import torch

    if variant == "liger":
        import liger_kernel.transformers as liger_kernel

        getattr(liger_kernel, liger)()  # class mode: before instantiation
    torch.manual_seed(0)
    with torch.device(device):
        model = cls._from_config(config, attn_implementation="sdpa", dtype=dtype)
    if variant.startswith("greta"):
        from greta_core.transformers import apply_greta

        attention = {"greta-sdpa": False, "greta-attn": "always"}.get(variant, True)
        apply_greta(model, attention=attention)
    return model


def tokens(vocab: int, batch: int, seq: int, seed: int, device: str) -> Any:
    import torch

    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (batch, seq), generator=gen).to(device)


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _probe(model: Any, trainer: Any, vocab: int, device: str, seq: int) -> dict[str, Any]:
    """Logits of one eval batch, loss and selected gradients of one training step."""
    import torch

    ids = tokens(vocab, 1, seq, 1, device)
    model.eval()
    with torch.no_grad():
        logits = model(ids).logits[:, -PROBE_KEEP:].float().cpu()
    model.train()
    out = trainer(ids, labels=ids)
    out.loss.backward()
    norms, q_grad = {}, None
    for name, p in model.named_parameters():
        if p.grad is not None:
            norms[name] = float(p.grad.float().norm())
            if q_grad is None and "layers.0." in name and "q_proj.weight" in name:
                q_grad = p.grad[:PROBE_GRAD_ROWS].float().cpu()
    model.zero_grad(set_to_none=True)
    return {"logits": logits, "loss": float(out.loss.detach()), "norms": norms, "q_grad": q_grad}


def agreement(probe: dict[str, Any], ref: dict[str, Any]) -> dict[str, float]:
    """This variant's probe against vanilla's: relative errors (0 for vanilla itself)."""
    out: dict[str, float] = {}
    diff = (probe["logits"] - ref["logits"]).abs()
    out["logits_max_rel_err"] = float(diff.max() / ref["logits"].abs().max())
    out["logits_rel_l2_err"] = float(
        (probe["logits"] - ref["logits"]).norm() / ref["logits"].norm()
    )
    out["loss_rel_err"] = abs(probe["loss"] - ref["loss"]) / abs(ref["loss"])
    if probe["q_grad"] is not None and ref["q_grad"] is not None:
        out["grad_rel_err"] = float((probe["q_grad"] - ref["q_grad"]).norm() / ref["q_grad"].norm())
    common = [k for k in ref["norms"] if k in probe["norms"] and ref["norms"][k] > 0]
    if common:
        out["grad_norm_max_rel_err"] = max(
            abs(probe["norms"][k] - ref["norms"][k]) / ref["norms"][k] for k in common
        )
    return out


def train_step(model: Any, trainer: Any, regime: Regime, device: str) -> Any:
    """One training step of `regime`'s batch through `trainer` (the model, or its compiled
    form): forward with labels, backward, gradients dropped; it returns the loss, which
    synchronises, so each step is timed whole. The model is put in training mode."""
    model.train()
    batch = tokens(model.config.vocab_size, regime.batch, regime.seq, 2, device)

    def step() -> float:
        out = trainer(batch, labels=batch)
        out.loss.backward()
        model.zero_grad(set_to_none=True)
        return out.loss.item()

    return step


def generate_kwargs(regime: Regime, variant: str) -> dict[str, Any]:
    """``generate``'s arguments for a decode regime: greedy, exactly its new tokens; with a
    static cache, compiled by transformers for the ``compile`` variant only."""
    n = regime.new_tokens
    kw: dict[str, Any] = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
    if regime.kind == "generate-static":
        kw.update(cache_implementation="static", disable_compile=variant != "compile")
    return kw


def grid_metadata(preset: str, device: str) -> dict[str, Any]:
    """The metadata of these benches' results: ``collect``'s, plus transformers' and
    Liger-Kernel's versions where installed."""
    from importlib.metadata import version

    from greta_core.bench.metadata import collect

    meta = collect(preset, device)
    for dist in ("transformers", "liger-kernel"):
        with contextlib.suppress(Exception):
            meta["versions"][dist.replace("-", "_")] = version(dist)
    return meta


def _train(model: Any, trainer: Any, regime: Regime, vocab: int, device: str) -> dict[str, Any]:
    import torch

    step = train_step(model, trainer, regime, device)
    t0 = time.perf_counter()
    for _ in range(regime.warmup):
        step()
    first_s = time.perf_counter() - t0
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    _sync(device)
    times = []
    for _ in range(regime.steps):
        t0 = time.perf_counter()
        loss = step()
        times.append((time.perf_counter() - t0) * 1e3)
    return {
        "ms": statistics.median(times), "ms_mean": statistics.fmean(times),
        "ms_all": [round(t, 2) for t in times], "loss": loss, "first_s": first_s,
    }  # fmt: skip


def _decode(model: Any, regime: Regime, vocab: int, device: str, variant: str) -> dict[str, Any]:
    import torch

    model.eval()
    prompt = tokens(vocab, regime.batch, regime.seq, 3, device)
    kw = generate_kwargs(regime, variant)
    rates = []
    with torch.no_grad():
        # The warm-up generates as many tokens: every cache length (and, for a compiled
        # forward, every graph) the timed runs meet has been met once.
        t0 = time.perf_counter()
        model.generate(prompt, **kw)
        first_s = time.perf_counter() - t0
        for _ in range(regime.steps):
            _sync(device)
            t0 = time.perf_counter()
            out = model.generate(prompt, **kw)
            _sync(device)
            new = (out.shape[1] - prompt.shape[1]) * regime.batch
            rates.append(new / (time.perf_counter() - t0))
    return {"tok_s": statistics.median(rates), "tok_s_all": [round(r, 2) for r in rates],
            "first_s": first_s}  # fmt: skip


def job_skip_reason(variant: str, device: str) -> str:
    """Why a variant cannot run at all here ("" when it can)."""
    if variant != "liger":
        return ""
    if device == "cpu":
        return "Liger-Kernel's Triton kernels need a GPU"
    try:
        import liger_kernel.transformers  # noqa: F401
    except Exception as exc:
        return f"liger_kernel not importable: {exc.__class__.__name__}: {exc}"[:300]
    return ""


def skip_reason(variant: str, regime: Regime) -> str:
    """Why a variant skips one regime ("" when it runs it)."""
    if variant == "compile" and regime.kind == "decode":
        return "eager decode is not torch.compile's regime: see generate-static"
    return ""


def run_job(job: Job) -> list[dict[str, Any]]:
    """Every regime of one (family, variant); one row each, under the run's ``--config``."""
    with overridden(job.extra.get("config")):
        return _run_job(job)


def _run_job(job: Job) -> list[dict[str, Any]]:
    import torch

    from greta_core import observe

    family = FAMILIES[job.family]
    regimes = [(TINY_REGIMES if job.tiny else REGIMES)[r] for r in job.regimes]
    base = {"family": job.family, "variant": job.variant}
    rows: list[dict[str, Any]] = []

    def regime_row(r: Regime) -> dict[str, Any]:
        return {
            **base,
            "regime": r.name,
            "batch": r.batch,
            "seq": r.seq,
            "new_tokens": r.new_tokens,
        }

    reason = job_skip_reason(job.variant, job.device)
    if reason:
        return [{**regime_row(r), "status": "skipped", "reason": reason} for r in regimes]
    dtype = torch.bfloat16 if job.device == "cuda" else torch.float32
    model = build(family, job.variant, job.device, dtype, job.tiny)
    vocab = model.config.vocab_size
    trainer = model
    if job.variant == "compile":
        # dynamic=False: one static graph per shape, what a run at a fixed shape gets (an
        # automatic dynamic-shape graph after the second shape would be another program).
        trainer = torch.compile(model, backend=job.compile_backend, dynamic=False)
    params = sum(p.numel() for p in model.parameters())
    observe.reset()
    probe_file = job.probe_dir / f"{job.family}.pt"
    agree: dict[str, float] = {}
    try:
        probe_seq = TINY_PROBE_SEQ if job.tiny else PROBE_SEQ
        probe = _probe(model, trainer, vocab, job.device, probe_seq)
        if job.variant == "vanilla":
            torch.save(probe, probe_file)
        if probe_file.is_file():
            agree = agreement(probe, torch.load(probe_file))
    except Exception as exc:  # the agreement columns stay empty; the timings still run
        traceback.print_exc(file=sys.stderr)
        agree = {}
        base["probe_error"] = f"{exc.__class__.__name__}: {exc}"[:200]
    for regime in regimes:
        row = {**regime_row(regime), "params": params, **agree}
        reason = skip_reason(job.variant, regime)
        if reason:
            rows.append({**row, "status": "skipped", "reason": reason})
            continue
        if job.device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        try:
            if regime.kind == "train":
                row.update(_train(model, trainer, regime, vocab, job.device))
            else:
                row.update(_decode(model, regime, vocab, job.device, job.variant))
            if job.device == "cuda":
                row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
            row["status"] = "ok"
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            oom = isinstance(exc, torch.cuda.OutOfMemoryError)
            row.update(status="oom" if oom else "failed",
                       reason=f"{exc.__class__.__name__}: {exc}"[:400])  # fmt: skip
            model.zero_grad(set_to_none=True)
        row["implementations"] = json.dumps(observe.implementations_seen(), sort_keys=True)
        observe.reset()
        rows.append(row)
    return rows


def worker_main(args: argparse.Namespace) -> int:
    job = Job(**json.loads(args.worker))
    job.probe_dir = Path(job.probe_dir)
    try:
        rows = run_job(job)
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        reason = f"{exc.__class__.__name__}: {exc}"[:400]
        rows = [{"family": job.family, "variant": job.variant, "regime": r,
                 "status": "failed", "reason": reason} for r in job.regimes]  # fmt: skip
    for row in rows:
        print("ROW " + json.dumps(row), flush=True)
    return 0


# --- the driver ----------------------------------------------------------------------------------


def _in_subprocess(job: Job, timeout: float) -> list[dict[str, Any]]:
    payload = json.dumps({**asdict(job), "probe_dir": str(job.probe_dir)})
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", payload]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    rows: list[dict[str, Any]] = []
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False
        )
        stdout, stderr, code = proc.stdout, proc.stderr, proc.returncode
        reason = None
    except subprocess.TimeoutExpired as exc:
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        stderr, code = "", None
        reason = f"timed out after {timeout:.0f} s"
    for line in stdout.splitlines():
        if line.startswith("ROW "):
            rows.append(json.loads(line[4:]))
    done = {r["regime"] for r in rows}
    if reason is None:
        tail = (stderr or stdout).strip().splitlines()[-3:]
        reason = f"exit {code}: {' | '.join(tail)}"[:400]
    for regime in job.regimes:
        if regime not in done:
            rows.append({"family": job.family, "variant": job.variant, "regime": regime,
                         "status": "failed", "reason": reason})  # fmt: skip
    return rows


def _in_process(job: Job) -> list[dict[str, Any]]:
    try:
        return run_job(job)
    finally:
        revert_all()


def revert_all() -> None:
    """Undo every apply_greta of this process (models and families), so the next variant
    run in it starts from transformers' own code."""
    from greta_core.transformers import apply as greta_apply
    from greta_core.transformers import revert_greta

    for key in greta_apply.patched_targets():
        revert_greta(key)


def _metric(regime: str) -> tuple[str, bool]:
    """(column, higher is better) of a regime."""
    return ("ms", False) if regime.startswith("train") else ("tok_s", True)


def summarize(
    rows: list[dict[str, Any]], regimes: dict[str, Regime],
    interleaved: dict[tuple[str, str], float] | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    """Per (family, regime): GRETA against vanilla and the best of torch.compile / Liger,
    with issue 26's verdict: "ahead" (>= vanilla everywhere; in a GPU-bound training cell
    also >= the best peer at <= Liger's peak memory), "behind-vanilla", "behind-peer",
    "over-memory", or "incomplete". `interleaved`: GRETA's speed over vanilla's per
    host-bound (family, regime) from ``bench/hf_host_ab.py`` (one process, alternating
    rounds), which the verdict reads instead of the two processes' ratio: between processes
    such a cell moves by more than the gap it measures."""
    interleaved = interleaved or {}
    cells: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for r in rows:
        if r.get("status") == "ok":
            cells.setdefault((r["family"], r["regime"]), {})[r["variant"]] = r
    order = {name: i for i, name in enumerate(REGIMES)}
    out = []
    for (fam, reg), by in sorted(cells.items(), key=lambda kv: (kv[0][0], order.get(kv[0][1], 99))):
        col, higher = _metric(reg)
        regime = regimes.get(reg)
        gpu_bound = bool(regime and regime.gpu_bound)
        s: dict[str, Any] = {"family": fam, "regime": reg, "metric": col,
                             "bound": "gpu" if gpu_bound else "host"}  # fmt: skip
        g, v = by.get("greta"), by.get("vanilla")
        peers = [by[p] for p in PEERS if p in by]
        if g:
            s["greta"], s["greta_peak_gib"] = g[col], g.get("peak_gib")
        if v:
            s["vanilla"] = v[col]
        if "liger" in by:
            s["liger_peak_gib"] = by["liger"].get("peak_gib")
        if peers:
            best = (max if higher else min)(peers, key=lambda r: r[col])
            s["best_peer"], s["best_peer_value"] = best["variant"], best[col]

        if g and v:
            s["greta_vs_vanilla"] = _speedup(g[col], v[col], higher)
        if not gpu_bound and (fam, reg) in interleaved:
            s["greta_vs_vanilla_interleaved"] = interleaved[(fam, reg)]
        if g and peers:
            s["greta_vs_best_peer"] = _speedup(g[col], s["best_peer_value"], higher)
        s["verdict"] = verdict(s, gpu_bound and reg.startswith("train"))
        out.append(s)
    return out


def regime_table(metadata: dict[str, Any]) -> dict[str, Regime]:
    """The regimes a grid's rows were measured with: the tiny ones for a --tiny grid."""
    return TINY_REGIMES if metadata.get("preset") == "tiny" else REGIMES


def host_cell(row: dict[str, Any]) -> tuple[str, str]:
    """An hf_host_ab row's (family, regime); rows written before it took decode are
    training rows."""
    return row["family"], row.get("regime", "train-b1s256")


def resummarize(out: Path) -> bool:
    """Recompute the summary of the grid in `out` (its JSON and summary CSV) with the
    interleaved cells now beside it; False where `out` holds no grid."""
    path = out / "hf_grid.json"
    if not path.is_file():
        return False
    doc = json.loads(path.read_text())
    write(out, doc, regime_table(doc["metadata"]))
    return True


def interleaved(path: Path) -> dict[tuple[str, str], float]:
    """(family, regime) -> GRETA's speed over vanilla's from ``bench/hf_host_ab.py``'s JSON
    at `path` ({} where there is none)."""
    if not path.is_file():
        return {}
    rows = json.loads(path.read_text()).get("rows", [])
    return {host_cell(r): r["greta_vs_vanilla"] for r in rows}


def _speedup(greta: float, other: float, higher_is_better: bool) -> float:
    """How many times faster GRETA is than `other` (> 1: GRETA ahead)."""
    return greta / other if higher_is_better else other / greta


def verdict(s: dict[str, Any], gpu_bound_training: bool) -> str:
    vs_vanilla = s.get("greta_vs_vanilla_interleaved", s.get("greta_vs_vanilla"))
    if vs_vanilla is None:
        return "incomplete"
    if vs_vanilla < 1 - TIME_TOL:
        return "behind-vanilla"
    if not gpu_bound_training:
        return "ahead"
    if "greta_vs_best_peer" not in s:
        return "incomplete"
    if s["greta_vs_best_peer"] < 1 - TIME_TOL:
        return "behind-peer"
    g_mem, l_mem = s.get("greta_peak_gib"), s.get("liger_peak_gib")
    if g_mem is not None and l_mem is not None and g_mem > l_mem * (1 + MEM_TOL):
        return "over-memory"
    return "ahead"


def plot(path: Path, rows: list[dict[str, Any]], title: str) -> None:
    """One panel per regime: each variant's speed relative to vanilla, per family."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    regimes = [r for r in REGIMES if any(x["regime"] == r for x in rows)]
    families = list(dict.fromkeys(r["family"] for r in rows))
    variants = [v for v in VARIANTS if any(r["variant"] == v for r in rows)]
    cols = min(3, max(1, len(regimes)))
    nrows = math.ceil(len(regimes) / cols) or 1
    fig, axes = plt.subplots(nrows, cols, figsize=(5.5 * cols, 3.8 * nrows), squeeze=False)
    width = 0.8 / max(len(variants), 1)
    for k, reg in enumerate(regimes):
        ax = axes[k // cols][k % cols]
        col, higher = _metric(reg)
        for i, variant in enumerate(variants):
            xs, hs = [], []
            for j, fam in enumerate(families):
                get = {
                    (r["family"], r["regime"], r["variant"]): r
                    for r in rows
                    if r.get("status") == "ok"
                }
                mine, base = get.get((fam, reg, variant)), get.get((fam, reg, "vanilla"))
                if mine and base and mine.get(col) and base.get(col):
                    xs.append(j + (i - (len(variants) - 1) / 2) * width)
                    hs.append(mine[col] / base[col] if higher else base[col] / mine[col])
            if xs:
                ax.bar(xs, hs, width=width, label=variant, color=f"C{VARIANTS.index(variant)}")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xticks(range(len(families)))
        ax.set_xticklabels(families, fontsize=8)
        ax.set_title(f"{reg}: speed vs vanilla (higher is better)", fontsize=9)
    for k in range(len(regimes), nrows * cols):
        axes[k // cols][k % cols].axis("off")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_names(
    text: str, known: dict[str, Any] | tuple[str, ...], what: str, parser: Any,
    flag: str | None = None,
) -> list[str]:  # fmt: skip
    """A comma list of `what` names from `known`; an unknown one is the parser's error, and
    with `flag` (the option's name) so is none at all."""
    names = [x for x in text.split(",") if x]
    unknown = [x for x in names if x not in known]
    if unknown:
        parser.error(f"unknown {what}: {', '.join(unknown)}; expected some of {', '.join(known)}")
    if flag and not names:
        parser.error(f"{flag}: expected some of {', '.join(known)}")
    return names


def grid_device(tiny: bool, asked: str | None = None) -> str:
    """Where these benches run: `asked`, else the CPU for --tiny or without a GPU, else cuda."""
    import torch

    return asked or ("cpu" if tiny or not torch.cuda.is_available() else "cuda")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=False, help="result folder")
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--regimes", default=",".join(REGIMES))
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS))
    parser.add_argument("--tiny", action="store_true", help="CPU format check (seconds)")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if visible)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per process")
    parser.add_argument(
        "--budget-s", type=float, default=180.0,
        help="start no new (family, variant) process after this many seconds (one started "
        "before may run --timeout more: defaults 180 + 300 s fit an 8-minute call)",
    )  # fmt: skip
    parser.add_argument("--compile-backend", default=None, help="default inductor (--tiny: eager)")
    parser.add_argument("--append", action="store_true", help="keep earlier rows in --out")
    parser.add_argument("--in-process", action="store_true", help="no subprocess per variant")
    parser.add_argument(
        "--subprocess", action="store_true", help="a process per variant with --tiny too"
    )
    add_grid_options(
        parser, "hf_grid.json", "every process of the run", "family, regime and variant"
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main(args)
    if args.merge:
        return run_merge(parser, merge, args.out, args.merge)
    families = parse_names(args.families, FAMILIES, "family", parser)
    regimes = parse_names(args.regimes, REGIMES, "regime", parser)
    variants = parse_names(args.variants, VARIANTS, "variant", parser)
    if args.out is None:
        parser.error("--out is required")
    try:
        override = config_override(args.config)
    except (ValueError, OSError) as exc:
        parser.error(str(exc))

    device = grid_device(args.tiny, args.device)
    if "vanilla" in variants:  # the agreement reference runs first
        variants = ["vanilla", *(v for v in variants if v != "vanilla")]
    from greta_core.bench.metadata import command_line

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    probe_dir = out / ".probes"  # scratch: vanilla's probe for later calls; not a result
    probe_dir.mkdir(exist_ok=True)
    meta = grid_metadata("tiny" if args.tiny else "grid", device)
    meta["families"] = {f: {**asdict(FAMILIES[f]), "config": family_config(FAMILIES[f], args.tiny).to_dict()}
                        for f in families}  # fmt: skip
    table = TINY_REGIMES if args.tiny else REGIMES
    meta["regimes"] = {r: asdict(table[r]) for r in regimes}
    meta["time_tol"], meta["mem_tol"] = TIME_TOL, MEM_TOL
    meta["config"] = override
    command = command_line("bench/hf_grid.py", sys.argv[1:] if argv is None else argv, out / "x")
    rows: list[dict[str, Any]] = []
    previous = out / "hf_grid.json"
    if args.append and previous.is_file():
        old = json.loads(previous.read_text())
        now = {(f, r, v) for f in families for r in regimes for v in variants}
        rows = [x for x in old["rows"] if (x["family"], x["regime"], x["variant"]) not in now]
    compile_backend = args.compile_backend or ("eager" if args.tiny else "inductor")
    in_process = args.in_process or (args.tiny and not args.subprocess)
    t_start, not_run = time.time(), []

    def doc() -> dict[str, Any]:
        return {"metadata": meta, "command": command, "rows": rows, "not_run_budget": not_run}

    for fam in families:
        for variant in variants:
            if time.time() - t_start > args.budget_s:
                not_run.append(f"{fam}/{variant}")
                continue
            job = Job(fam, variant, regimes, device, args.tiny, probe_dir, compile_backend,
                      {"config": override} if override else {})  # fmt: skip
            t0 = time.time()
            got = _in_process(job) if in_process else _in_subprocess(job, args.timeout)
            rows.extend(got)
            write(out, doc(), table)
            print(f"{fam:8s} {variant:10s} {time.time() - t0:6.1f} s: "
                  + ", ".join(f"{r['regime']} {r['status']}" for r in got), flush=True)  # fmt: skip
    if not_run:
        print(f"not run (--budget-s {args.budget_s:.0f}): {', '.join(not_run)}")
    return finish(out, doc(), table)


def write(out: Path, doc: dict[str, Any], table: dict[str, Regime]) -> list[dict[str, Any]]:
    """The grid's JSON and CSVs in `out`, its summary (returned) computed afresh with the
    interleaved cells beside it."""
    from greta_core.bench.report import write_csv, write_json

    summary = summarize(doc["rows"], table, interleaved(out / INTERLEAVED))
    write_json(out / "hf_grid.json", {**doc, "summary": summary})
    write_csv(out / "hf_grid.csv", doc["rows"], FIELDS)
    write_csv(out / "hf_grid_summary.csv", summary, SUMMARY_FIELDS)
    return summary


def finish(out: Path, doc: dict[str, Any], table: dict[str, Regime]) -> int:
    """Summarize `doc`'s rows (with the interleaved cells beside them in `out`), write the
    grid's JSON, CSVs and PNG there and print its tables."""
    rows, meta = doc["rows"], doc["metadata"]
    summary = write(out, doc, table)
    written = ["hf_grid.json", "hf_grid.csv", "hf_grid_summary.csv"]
    try:
        gpu = meta.get("gpu_name") or "CPU"
        torch_version = (meta.get("versions") or {}).get("torch")
        plot(out / "hf_grid.png", rows, f"HF grid, random init, {gpu}, torch {torch_version}")
        written.append("hf_grid.png")
    except Exception as exc:  # matplotlib missing: the numbers are written already
        print(f"no PNG: {exc.__class__.__name__}: {exc}")
    print(f"wrote {', '.join(written)} in {out}")
    print(f"\n{'family':8s} {'regime':16s} {'variant':10s} {'status':8s} {'ms':>8} {'tok/s':>8} "
          f"{'peak GiB':>8} {'loss err':>8} {'grad err':>8}")  # fmt: skip
    for r in rows:
        print(
            f"{r['family']:8s} {r['regime']:16s} {r['variant']:10s} {r['status']:8s} "
            f"{r.get('ms') or math.nan:8.1f} {r.get('tok_s') or math.nan:8.1f} "
            f"{r.get('peak_gib') or math.nan:8.2f} {r.get('loss_rel_err', math.nan):8.1e} "
            f"{r.get('grad_rel_err', math.nan):8.1e}"
        )
    print(f"\n{'family':8s} {'regime':16s} {'bound':5s} {'vs vanilla':>10} {'vs peer':>8} verdict")
    for s in summary:
        print(
            f"{s['family']:8s} {s['regime']:16s} {s['bound']:5s} "
            f"{s.get('greta_vs_vanilla', math.nan):10.2f} {s.get('greta_vs_best_peer', math.nan):8.2f} "
            f"{s['verdict']}"
        )
    return 0


def merge(out: Path | None, sources: list[Path]) -> int:
    """--merge: `out`'s grid (where there is one), then each source's rows, a later row
    replacing an earlier one of the same (family, regime, variant); summary and files anew."""
    from greta_core.bench.report import merge_grid
    from greta_core.errors import BenchError

    if out is None:
        raise BenchError("--out is required")
    doc = merge_grid(out / "hf_grid.json", sources, "bench/hf_grid.py",
                     lambda r: (r["family"], r["regime"], r["variant"]),
                     lambda r: f"{r['family']}/{r['variant']}", ("families", "regimes"))  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    return finish(out, doc, regime_table(doc["metadata"]))


if __name__ == "__main__":
    sys.exit(main())
