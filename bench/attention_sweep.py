"""Attention on one GPU, fwd and fwd+bwd side by side with SDPA, plus a sweep of the three
Triton kernels' tiles (forward, backward dk/dv, backward dq) in one time-boxed run.

For each issue-13 shape (B4 Hq32, Hkv 32 or 8, S 2048 or 4096, D 64 or 128, causal; and
the non-causal D128 S2048 row of bench/attention_bwd.py) it times, with
``triton.testing.do_bench`` (median):

- SDPA forward and forward+backward with PyTorch's default backend choice and with cuDNN
  and flash forced (GQA by ``repeat_interleave``, as bench/attention_bwd.py, and by SDPA's
  ``enable_gqa``); the fastest one is the reference;
- ``torch.ops.greta.attention`` forward and forward+backward with the table's configs
  ("default") and with the best configs the sweep found ("best"), and the host time to
  enqueue one forward+backward step;
- each kernel alone at its table config and at every candidate: candidates are swept on
  one shape per head dim (B4 H32/8 S2048, the Llama training shape), the fastest few are
  then timed on every shape of that head dim. Each candidate's outputs are first checked
  against the table config's (relative norm), a wrong or failing one is never timed.

Compiles count against ``--budget-s`` (wall clock of the whole run): candidates are
ordered most-promising first and interleaved across the three kernels, and the remaining
ones are skipped (and listed) when the budget runs out. Writes ``<out>.json`` (metadata,
every measurement), ``<out>.csv`` (one row per shape) and ``<out>_table.json`` (rules to
paste into greta_core/configs/tables/sm_90.json), and prints a summary.

    python3 bench/attention_sweep.py --budget-s 270 --out bench/results/h100/attention_sweep
    python3 bench/attention_sweep.py --dry-run   # CPU: candidates and their checks only
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import itertools
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

Config = dict[str, int]
Shape = tuple[int, int, int, int, int, bool]  # (B, Hq, Hkv, S, D, causal)

KERNELS = ("fwd", "dkdv", "dq")
TABLE_OPS = {"fwd": "attention", "dkdv": "attention_bwd_dkdv", "dq": "attention_bwd_dq"}
SHAPES: list[Shape] = [
    (4, 32, hkv, s, d, True) for d in (128, 64) for s in (2048, 4096) for hkv in (32, 8)
] + [(4, 32, 32, 2048, 128, False)]
# Candidates are swept on this (Hkv, S) per head dim (causal), then the best few everywhere.
SWEEP_AT = (8, 2048)
TOP_K = 3
# H100: 227 KiB of shared memory per block (opt-in maximum).
SMEM_LIMIT = 232448
# fp32 registers per thread available to the tiles before spills are likely (of 255).
REG_SOFT_LIMIT = 192
# Candidate outputs vs the table config's: relative norm of the difference. Every output is
# bf16 (the gradients too): another tile sums in another order, which flips the rounding of
# some elements by one bf16 ulp (2^-8 relative); a wrong kernel is off by O(1).
MAX_REL_DIFF = {"fwd": 5e-3, "dkdv": 5e-3, "dq": 5e-3}


def _cfg(m: int, n: int, w: int, s: int) -> Config:
    return {"BLOCK_M": m, "BLOCK_N": n, "num_warps": w, "num_stages": s}


def candidates(kernel: str, head_dim: int) -> list[Config]:
    """The candidate space of `kernel` at `head_dim`, most promising first, pruned by
    `problems` (hard limits) and by an fp32 register estimate (likely spills)."""
    if kernel == "fwd":
        # Two warpgroups own 128 query rows (wgmma m64 each); one owns 64.
        raw = [_cfg(128, 128, 8, 3), _cfg(128, 64, 8, 3), _cfg(64, 64, 4, 3)]
        raw += [_cfg(128, 128, 8, 2), _cfg(128, 64, 8, 2), _cfg(128, 64, 8, 4)]
        raw += [_cfg(64, 64, 4, 4), _cfg(64, 128, 4, 3), _cfg(128, 32, 8, 3)]
        raw += [_cfg(128, 128, 8, 4), _cfg(128, 64, 4, 3)]
    elif kernel == "dkdv":
        raw = [
            _cfg(m, n, w, s)
            for n, m, w, s in itertools.product((64, 128), (32, 64), (4, 8), (2, 3))
        ]
        raw.append(_cfg(16, 64, 4, 2))
    else:
        raw = [
            _cfg(m, n, w, s)
            for m, n, w, s in itertools.product((64, 128), (64, 32), (4, 8), (2, 3))
        ]
    keep = [c for c in raw if not problems(kernel, c, head_dim) and _regs(kernel, c, head_dim)]
    return keep


def _dot_rows(kernel: str, cfg: Config) -> int:
    """Rows (M) of the kernel's matrix products: what the warps split."""
    return cfg["BLOCK_N"] if kernel == "dkdv" else cfg["BLOCK_M"]


def _regs(kernel: str, cfg: Config, head_dim: int) -> bool:
    """fp32 accumulators + one score tile per thread under REG_SOFT_LIMIT."""
    threads = 32 * cfg["num_warps"]
    m, n = cfg["BLOCK_M"], cfg["BLOCK_N"]
    acc = {"fwd": m * head_dim, "dkdv": 2 * n * head_dim, "dq": m * head_dim}[kernel]
    scores = m * n * (1 if kernel == "fwd" else 2)  # bwd keeps p and dp
    return (acc + scores) / threads <= REG_SOFT_LIMIT


def smem_bytes(kernel: str, cfg: Config, head_dim: int, elem: int = 2) -> int:
    """Shared memory of the pipelined loads (bf16 tiles): what fails a compile on sm_90."""
    m, n, stages = cfg["BLOCK_M"], cfg["BLOCK_N"], max(cfg["num_stages"], 1)
    if kernel == "fwd":  # q resident; k, v streamed
        return (m * head_dim + stages * 2 * n * head_dim) * elem
    if kernel == "dkdv":  # k, v resident; q, do streamed; p/ds staged for the dots
        return (2 * n * head_dim + stages * 2 * m * head_dim + 2 * m * n) * elem
    return (2 * m * head_dim + stages * 2 * n * head_dim + m * n) * elem  # dq


def problems(kernel: str, cfg: Config, head_dim: int) -> list[str]:
    """Why `cfg` cannot run `kernel` on sm_90 (empty: it can)."""
    out = []
    for key in ("BLOCK_M", "BLOCK_N"):
        v = cfg.get(key, 0)
        if v < 16 or v & (v - 1):
            out.append(f"{key}={v} is not a power of two >= 16 (tl.dot, tl.arange)")
    if cfg.get("num_warps") not in (4, 8):
        out.append(f"num_warps={cfg.get('num_warps')} is not 4 or 8 (one or two warpgroups)")
    if not 1 <= cfg.get("num_stages", 0) <= 5:
        out.append(f"num_stages={cfg.get('num_stages')} outside 1..5")
    if not out:
        if _dot_rows(kernel, cfg) < 16 * cfg["num_warps"]:
            out.append(
                f"{_dot_rows(kernel, cfg)} dot rows for {cfg['num_warps']} warps (< 16 each)"
            )
        if smem_bytes(kernel, cfg, head_dim) > SMEM_LIMIT:
            out.append(f"~{smem_bytes(kernel, cfg, head_dim)} B shared memory > {SMEM_LIMIT}")
    return out


def _kernel_fn(kernel: str) -> Any:
    from greta_core.kernels import attention, attention_bwd

    return {
        "fwd": attention.attention_fwd_kernel,
        "dkdv": attention_bwd.attention_bwd_dkdv_kernel,
        "dq": attention_bwd.attention_bwd_dq_kernel,
    }[kernel]


def check_against_kernel(kernel: str) -> list[str]:
    """The constexprs this script sets must be the kernel's parameters."""
    names = set(_kernel_fn(kernel).arg_names)
    wanted = {"HEAD_DIM", "BLOCK_M", "BLOCK_N", "CAUSAL", "UPCAST"}
    return sorted(wanted - names)


def label(cfg: Config) -> str:
    return f"{cfg['BLOCK_M']}x{cfg['BLOCK_N']} w{cfg['num_warps']} s{cfg['num_stages']}"


def shape_label(shape: Shape) -> str:
    b, hq, hkv, s, d, causal = shape
    return f"B{b} H{hq}/{hkv} S{s} D{d}{' causal' if causal else ''}"


# --- turning results into table rules -------------------------------------------------------


def pick(per_shape: dict[str, dict[str, float]]) -> str | None:
    """The candidate with the lowest geometric-mean time over the shapes where every
    candidate considered was timed (a candidate missing on a shape is out)."""
    shapes = [s for s in per_shape if per_shape[s]]
    if not shapes:
        return None
    common = set.intersection(*(set(per_shape[s]) for s in shapes))
    finite = [c for c in common if all(math.isfinite(per_shape[s][c]) for s in shapes)]
    if not finite:
        return None
    return min(
        sorted(finite),
        key=lambda c: sum(math.log(per_shape[s][c]) for s in shapes),
    )


def _entry(comment: str, default: Config, rules: list[dict[str, Any]]) -> dict[str, Any]:
    """A table entry; trailing rules that pick the default anyway are left out (first match
    wins, so only trailing ones can go without changing a lookup)."""
    while rules and rules[-1]["config"] == default:
        rules.pop()
    return {"comment": comment, "default": default, **({"rules": rules} if rules else {})}


def table_entries(best: dict[str, dict[Any, Config]], current: dict[str, Any]) -> dict[str, Any]:
    """sm_90.json entries from the best configs. `best["fwd"]` is keyed by (D, causal),
    `best["dkdv"]`/`best["dq"]` by D (the backward's features are D and backend only).
    `current`: the table's present "attention" entry (its decode rules stay first)."""
    out: dict[str, Any] = {}
    note = "tuned with bench/attention_sweep.py (H100, bf16, B4 H32 S2048-4096)"
    fwd = best.get("fwd", {})
    if fwd:
        default_key = (128, True) if (128, True) in fwd else sorted(fwd)[-1]
        decode = [r for r in current.get("rules", []) if "Sq_max" in r.get("when", {})]
        rules = list(decode)
        for (d, causal), cfg in sorted(fwd.items(), key=lambda kv: (kv[0][0], not kv[0][1])):
            if (d, causal) != default_key:
                rules.append({"when": {"D": d, "causal": causal}, "config": dict(cfg)})
        # Non-causal D64 (not swept) takes the causal D64 tiles, as the old D_max rule did.
        if (64, True) in fwd and (64, False) not in fwd and default_key != (64, True):
            rules.append({"when": {"D_max": 64}, "config": dict(fwd[(64, True)])})
        out["attention"] = _entry(f"H100: {note}.", dict(fwd[default_key]), rules)
    for kernel in ("dkdv", "dq"):
        per_d = best.get(kernel, {})
        if not per_d:
            continue
        top = max(per_d)
        out[TABLE_OPS[kernel]] = _entry(
            f"H100 FlashAttention-2 backward ({kernel}): {note}.",
            dict(per_d[top]),
            [{"when": {"D_max": d}, "config": dict(per_d[d])} for d in sorted(per_d) if d != top],
        )
    return out


# --- GPU measurement --------------------------------------------------------------------------


class Clock:
    def __init__(self, budget_s: float) -> None:
        self.start = time.monotonic()
        self.deadline = self.start + budget_s

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start


def bwd_grid(shape: Shape, kernel: str, cfg: Config, arch: str) -> tuple[int, ...]:
    """The grid the backward's plan gives `kernel` ("dkdv" or "dq") at `cfg`: key blocks x
    B * Hkv for dkdv (it sums each GQA group), query blocks x B * Hq for dq."""
    from greta_core.ops import attention_bwd as bwd

    b, hq, hkv, s, d, causal = shape
    no_strides = ((0, 0, 0),) * 5  # the grid does not depend on them
    p = bwd.plan((b, hq, s, d), (hkv, s), no_strides, "bfloat16", causal, None, arch, (cfg, cfg))
    return p.launches[1 if kernel == "dkdv" else 2].grid


def table_override(overrides: dict[str, Config]) -> Any:
    """Serve `overrides` (op name -> full config) from configs.lookup."""
    from greta_core import configs

    return configs.Override(overrides)


class Problem:
    """Inputs and launchers of one shape."""

    def __init__(self, shape: Shape, arch: str) -> None:
        import torch

        from greta_core.ops.attention import attention_with_lse

        b, hq, hkv, s, d, causal = shape
        self.shape, self.arch = shape, arch
        gen = torch.Generator(device="cuda").manual_seed(0)
        mk = lambda h: torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=gen)  # noqa: E731
        self.q, self.k, self.v, self.do = mk(hq), mk(hkv), mk(hkv), mk(hq)
        self.o, self.lse = attention_with_lse(self.q, self.k, self.v, causal)
        self.delta = (self.o.float() * self.do.float()).sum(-1).contiguous()
        self.out = torch.empty_like(self.q)
        self.lse_out = torch.empty_like(self.lse)
        # What the backward's plan allocates: gradients in the inputs' dtype, dk/dv per KV head.
        self.dq = torch.empty_like(self.q)
        self.dk = torch.empty_like(self.k)
        self.dv = torch.empty_like(self.v)

    def _common(self) -> tuple:
        _b, hq, hkv, s, d, _causal = self.shape
        strides = [st for t in (self.q, self.k, self.v) for st in t.stride()[:3]]
        return (1.0 / math.sqrt(d), s, s, hq, hq // hkv, *strides)

    def launcher(self, kernel: str, cfg: Config) -> Callable[[], None]:
        from greta_core import configs

        b, hq, _hkv, s, d, causal = self.shape
        meta, opts = configs.meta_params(cfg), configs.launch_options(cfg, self.arch)
        fn = _kernel_fn(kernel)
        const = {"HEAD_DIM": d, "CAUSAL": causal, "UPCAST": False, **meta, **opts}
        if kernel == "fwd":
            grid = (triton_cdiv(s, meta["BLOCK_M"]), b * hq)
            args = (self.q, self.k, self.v, self.q, self.q, *self._common(),
                    *self.out.stride()[:3], self.out, self.lse_out)  # fmt: skip
            const["HAS_LENS"] = False
        else:
            head = (self.q, self.k, self.v, self.do, self.lse, self.delta, *self._common(),
                    *self.do.stride()[:3])  # fmt: skip
            grid = bwd_grid(self.shape, kernel, cfg, self.arch)
            args = (*head, self.dk, self.dv) if kernel == "dkdv" else (*head, self.dq)
        return lambda: fn[grid](*args, **const)

    def outputs(self, kernel: str) -> list[Any]:
        return [t.clone() for t in self._bufs()[kernel]]

    def poison(self, kernel: str) -> None:
        for t in self._bufs()[kernel]:
            t.fill_(float("nan"))

    def _bufs(self) -> dict[str, list[Any]]:
        return {
            "fwd": [self.out, self.lse_out],
            "dkdv": [self.dk, self.dv],
            "dq": [self.dq],
        }


def triton_cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def rel_diff(got: list[Any], want: list[Any]) -> float:
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        finite = w.isfinite()
        if not bool((g.isfinite() == finite).all()):
            return float("inf")
        g, w = g[finite].float(), w[finite].float()
        worst = max(worst, ((g - w).norm() / w.norm().clamp_min(1e-30)).item())
    return worst


def bench_ms(fn: Callable[[], Any], rep: int, grad_to_none: list | None = None) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=max(rep // 4, 5), rep=rep, grad_to_none=grad_to_none,
                          return_mode="median"))  # fmt: skip


def time_candidate(
    prob: Problem, kernel: str, cfg: Config, want: list[Any], rep: int
) -> dict[str, Any]:
    row: dict[str, Any] = {"kernel": kernel, "config": cfg, "shape": shape_label(prob.shape)}
    t0 = time.monotonic()
    try:
        prob.poison(kernel)
        run = prob.launcher(kernel, cfg)
        run()
        import torch

        torch.cuda.synchronize()
        row["first_call_s"] = round(time.monotonic() - t0, 2)
        err = rel_diff(prob.outputs(kernel), want)
        row["rel_diff_vs_table"] = err if math.isfinite(err) else "inf"
        if not err <= MAX_REL_DIFF[kernel]:
            row["error"] = f"outputs differ from the table config's (rel {err:.2e})"
            return row
        row["ms"] = round(bench_ms(run, rep), 4)
    except Exception as exc:  # out of resources, compile errors
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    return row


def sdpa_times(prob: Problem, rep: int) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    hq, hkv, causal = prob.shape[1], prob.shape[2], prob.shape[5]
    group = hq // hkv

    def repeated(a: Any, kk: Any, vv: Any) -> Any:
        if group > 1:
            kk, vv = kk.repeat_interleave(group, 1), vv.repeat_interleave(group, 1)
        return F.scaled_dot_product_attention(a, kk, vv, is_causal=causal)

    def native_gqa(a: Any, kk: Any, vv: Any) -> Any:
        return F.scaled_dot_product_attention(a, kk, vv, is_causal=causal, enable_gqa=True)

    leaves = [t.detach().clone().requires_grad_() for t in (prob.q, prob.k, prob.v)]
    out: dict[str, Any] = {}
    backends = {
        "default": None,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "flash": SDPBackend.FLASH_ATTENTION,
    }
    # GQA: k, v repeated per query head, and SDPA's own enable_gqa; the fastest counts.
    forms = {"": repeated, "+enable_gqa": native_gqa} if group > 1 else {"": repeated}
    for (name, backend), (suffix, sdpa) in itertools.product(backends.items(), forms.items()):
        name += suffix
        ctx = sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext()
        try:
            with ctx:
                with torch.no_grad():
                    fwd = bench_ms(lambda f=sdpa: f(prob.q, prob.k, prob.v), rep)

                def step(f: Callable[..., Any] = sdpa) -> None:
                    f(*leaves).backward(prob.do)

                step()
                both = bench_ms(step, rep, grad_to_none=leaves)
            out[name] = {"fwd_ms": round(fwd, 4), "fwd_bwd_ms": round(both, 4)}
        except Exception as exc:  # a backend that does not take this shape
            out[name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"}
    ok = {k: v for k, v in out.items() if "fwd_ms" in v}
    for key in ("fwd_ms", "fwd_bwd_ms"):
        if ok:
            name = min(ok, key=lambda n: ok[n][key])
            out[f"best_{key}"] = ok[name][key]
            out[f"best_{key}_backend"] = name
    return out


def greta_times(prob: Problem, rep: int) -> dict[str, Any]:
    import torch

    import greta_core.torch  # noqa: F401

    causal = prob.shape[5]
    leaves = [t.detach().clone().requires_grad_() for t in (prob.q, prob.k, prob.v)]

    def fwd() -> Any:
        return torch.ops.greta.attention(prob.q, prob.k, prob.v, causal)

    def step() -> None:
        torch.ops.greta.attention(*leaves, causal).backward(prob.do)

    with torch.no_grad():
        fwd()
        f_ms = bench_ms(fwd, rep)
    step()
    both = bench_ms(step, rep, leaves)
    # Host time to enqueue one step (no synchronisation inside): where it exceeds the GPU
    # time of a step, fwd_bwd_ms measures the host.
    n = 20
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        for t in leaves:
            t.grad = None
        step()
    host = (time.perf_counter() - start) / n * 1e3
    torch.cuda.synchronize()
    return {
        "fwd_ms": round(f_ms, 4),
        "fwd_bwd_ms": round(both, 4),
        "fwd_bwd_host_ms": round(host, 4),
    }


def measure(args: argparse.Namespace, clock: Clock) -> int:
    import torch

    from greta_core import configs
    from greta_core.arch import device_arch
    from greta_core.kernels.attention import features
    from greta_core.ops import attention_bwd as bwd

    arch = device_arch()
    notes: list[str] = []
    shapes = [s for s in SHAPES if args.noncausal or s[5]]
    swept = tuple(k for k in KERNELS if k in args.kernels)  # the kernels whose tiles are swept

    def table_cfg(kernel: str, shape: Shape) -> Config:
        d, s, causal = shape[4], shape[3], shape[5]
        if kernel == "fwd":
            return configs.lookup("attention", arch, features(d, s, s, causal))
        return bwd.kernel_configs(arch, d)[0 if kernel == "dkdv" else 1]

    # 1. References and the table configs, every shape (the part that must finish).
    baseline: dict[str, dict[str, Any]] = {}
    probs: dict[Shape, Problem] = {}
    for shape in shapes:
        prob = probs[shape] = Problem(shape, arch)
        row: dict[str, Any] = {
            "sdpa": sdpa_times(prob, args.rep),
            "greta_table": greta_times(prob, args.rep),
        }
        row["kernels_table"] = {}
        for kernel in KERNELS:
            cfg = table_cfg(kernel, shape)
            run = prob.launcher(kernel, cfg)
            run()
            row["kernels_table"][kernel] = {"config": cfg, "ms": round(bench_ms(run, args.rep), 4)}
        baseline[shape_label(shape)] = row
        print(f"[{clock.elapsed():6.1f}s] {shape_label(shape)}: {json.dumps(row)}", flush=True)
        if shape[3] == 4096:
            # The S4096 inputs stay for the final comparison only if memory allows; free
            # the gradients of the reference runs now.
            torch.cuda.empty_cache()

    # 2. Sweep on one shape per head dim, kernels interleaved, until the phase deadline.
    rows: list[dict[str, Any]] = []
    dims = sorted({s[4] for s in shapes if s[5]}, reverse=True)  # D128 first
    reserve = args.reserve_s
    timed: dict[str, dict[int, dict[str, dict[str, float]]]] = {k: {} for k in swept}
    skipped: dict[str, int] = {}
    for i, d in enumerate(dims):
        sweep_shape = next(s for s in shapes if s[4] == d and s[5] and (s[2], s[3]) == SWEEP_AT)
        prob = probs[sweep_shape]
        phase_end = time.monotonic() + (clock.left() - reserve) / (len(dims) - i)
        want = {}
        for kernel in swept:
            prob.launcher(kernel, table_cfg(kernel, sweep_shape))()
            want[kernel] = prob.outputs(kernel)
        queue = [
            (kernel, cfg)
            for tier in itertools.zip_longest(*(candidates(k, d) for k in swept))
            for kernel, cfg in zip(swept, tier, strict=True)
            if cfg is not None
        ]
        for n, (kernel, cfg) in enumerate(queue):
            if time.monotonic() > phase_end:
                skipped[f"D{d}"] = len(queue) - n
                notes.append(
                    f"D{d}: budget ran out, {len(queue) - n} of {len(queue)} candidates skipped"
                )
                break
            row = time_candidate(prob, kernel, cfg, want[kernel], args.sweep_rep)
            rows.append(row)
            if "ms" in row:
                per = timed[kernel].setdefault(d, {}).setdefault(shape_label(sweep_shape), {})
                per[label(cfg)] = row["ms"]
            print(f"[{clock.elapsed():6.1f}s] D{d} {kernel:4} {label(cfg):16} "
                  f"{row.get('ms', row.get('error'))}", flush=True)  # fmt: skip

    # 3. The fastest few per kernel (and the table config) on every shape of their head dim.
    best: dict[str, dict[Any, Config]] = {k: {} for k in KERNELS}
    by_label = {(k, label(c)): c for k in swept for d in dims for c in candidates(k, d)}
    for d in dims:
        for kernel in swept:
            at_sweep = next(iter(timed[kernel].get(d, {}).values()), {})
            top = sorted(at_sweep, key=at_sweep.get)[:TOP_K]
            groups = [True, False] if kernel == "fwd" else [None]
            for causal in groups:
                group = [s for s in shapes if s[4] == d and (causal is None or s[5] == causal)]
                if not group:
                    continue
                per_shape: dict[str, dict[str, float]] = {}
                for shape in group:
                    prob = probs[shape]
                    tcfg = table_cfg(kernel, shape)
                    per = per_shape.setdefault(shape_label(shape), {})
                    per[label(tcfg)] = baseline[shape_label(shape)]["kernels_table"][kernel]["ms"]
                    by_label.setdefault((kernel, label(tcfg)), tcfg)
                    prob.launcher(kernel, tcfg)()
                    want_s = prob.outputs(kernel)
                    for lab in top:
                        if lab in per:
                            continue
                        if clock.left() < reserve / 2:
                            notes.append(f"re-timing cut short at {shape_label(shape)} {kernel}")
                            break
                        row = time_candidate(
                            prob, kernel, by_label[(kernel, lab)], want_s, args.sweep_rep
                        )
                        row["phase"] = "top"
                        rows.append(row)
                        per[lab] = row.get("ms", float("inf"))
                chosen = pick(per_shape)
                if chosen is not None:
                    key = (d, causal) if kernel == "fwd" else d
                    best[kernel][key] = by_label[(kernel, chosen)]
                    rows.append({"kernel": kernel, "D": d, "causal": causal, "phase": "pick",
                                 "per_shape_ms": per_shape, "chosen": chosen})  # fmt: skip

    # 4. The op with the best configs, every shape.
    summary = []
    for shape in shapes:
        base = baseline[shape_label(shape)]
        d, causal = shape[4], shape[5]
        over = {}
        if (d, causal) in best["fwd"]:
            over["attention"] = best["fwd"][(d, causal)]
        for kernel in ("dkdv", "dq"):
            if d in best[kernel]:
                over[TABLE_OPS[kernel]] = best[kernel][d]
        greta_best = None
        if over and clock.left() > 5:
            with table_override(over):
                greta_best = greta_times(probs[shape], args.rep)
        elif over:
            notes.append(f"{shape_label(shape)}: no time left for the best-config run")
        sd = base["sdpa"]
        line = {
            "shape": shape_label(shape),
            "sdpa_fwd_ms": sd.get("best_fwd_ms"),
            "sdpa_fwd_backend": sd.get("best_fwd_ms_backend"),
            "sdpa_fwd_bwd_ms": sd.get("best_fwd_bwd_ms"),
            "sdpa_fwd_bwd_backend": sd.get("best_fwd_bwd_ms_backend"),
            "greta_table_fwd_ms": base["greta_table"]["fwd_ms"],
            "greta_table_fwd_bwd_ms": base["greta_table"]["fwd_bwd_ms"],
            "greta_table_fwd_bwd_host_ms": base["greta_table"].get("fwd_bwd_host_ms"),
            "greta_best_fwd_ms": greta_best["fwd_ms"] if greta_best else None,
            "greta_best_fwd_bwd_ms": greta_best["fwd_bwd_ms"] if greta_best else None,
            "best_fwd": label(over["attention"]) if "attention" in over else None,
            "best_dkdv": label(over["attention_bwd_dkdv"])
            if "attention_bwd_dkdv" in over
            else None,
            "best_dq": label(over["attention_bwd_dq"]) if "attention_bwd_dq" in over else None,
        }
        for which in ("table", "best"):
            for part in ("fwd", "fwd_bwd"):
                g, r = line[f"greta_{which}_{part}_ms"], line[f"sdpa_{part}_ms"]
                line[f"ratio_{which}_{part}"] = round(r / g, 3) if g and r else None
        summary.append(line)

    from greta_core import configs as cfgs
    from greta_core.bench.metadata import collect

    current = cfgs.load_table(arch)["ops"].get("attention", {})
    snippet = table_entries(best, current)
    meta = {
        **collect("attention_sweep", "cuda"),
        "dtype": "bfloat16",
        "budget_s": args.budget_s,
        "wall_s": round(clock.elapsed(), 1),
        "sweep_at": {"Hkv": SWEEP_AT[0], "S": SWEEP_AT[1]},
        "swept_kernels": list(swept),
        "skipped_candidates": skipped,
        "notes": notes,
        "ratio": "SDPA (fastest backend) ms / GRETA ms: >= 1 means GRETA is faster",
    }
    write_outputs(args.out, meta, baseline, rows, summary, snippet)
    return 0


def write_outputs(
    out: Path, meta: dict, baseline: dict, rows: list, summary: list, snippet: dict
) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"metadata": meta, "baseline": baseline, "sweep": rows, "summary": summary,
           "table_snippet": snippet}  # fmt: skip
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    out.with_name(out.name + "_table.json").write_text(json.dumps(snippet, indent=1) + "\n")
    if summary:
        with out.with_suffix(".csv").open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(summary[0]))
            writer.writeheader()
            writer.writerows(summary)
    print(f"\n{'shape':28} {'SDPA f':>8} {'f+b':>8} {'GRETA f':>8} {'f+b':>8} {'host':>8} {'best f':>8} "
          f"{'f+b':>8} {'ratio f':>8} {'f+b':>6}  best fwd | dkdv | dq")  # fmt: skip
    for s in summary:
        cells = [s["sdpa_fwd_ms"], s["sdpa_fwd_bwd_ms"], s["greta_table_fwd_ms"],
                 s["greta_table_fwd_bwd_ms"], s["greta_table_fwd_bwd_host_ms"],
                 s["greta_best_fwd_ms"], s["greta_best_fwd_bwd_ms"]]  # fmt: skip
        ratio_f = s["ratio_best_fwd"] or s["ratio_table_fwd"]
        ratio_b = s["ratio_best_fwd_bwd"] or s["ratio_table_fwd_bwd"]
        print(f"{s['shape']:28} " + " ".join(f"{c or float('nan'):8.3f}" for c in cells)
              + f" {ratio_f or float('nan'):8.3f} {ratio_b or float('nan'):6.3f}  "
              f"{s['best_fwd']} | {s['best_dkdv']} | {s['best_dq']}")  # fmt: skip
    for note in meta.get("notes", []):
        print("note:", note)
    print("\nTable entries for greta_core/configs/tables/sm_90.json (replace the ops' entries):")
    print(json.dumps(snippet, indent=1))


def dry_run(args: argparse.Namespace) -> int:
    """No GPU: the shapes, every candidate with its checks, the kernels' parameters."""
    report: dict[str, Any] = {"shapes": [shape_label(s) for s in SHAPES], "kernels": {}}
    bad = 0
    for kernel in KERNELS:
        missing = check_against_kernel(kernel)
        bad += len(missing)
        per_d = {}
        for d in sorted({s[4] for s in SHAPES}):
            cands = candidates(kernel, d)
            for c in cands:
                bad += bool(problems(kernel, c, d))
            per_d[f"D{d}"] = [
                {
                    "config": c,
                    "smem_bytes": smem_bytes(kernel, c, d),
                    "problems": problems(kernel, c, d),
                }
                for c in cands
            ]
            print(f"{kernel:4} D{d}: {len(cands)} candidates: " + ", ".join(map(label, cands)))
        report["kernels"][kernel] = {"missing_kernel_params": missing, "candidates": per_d}
    total = sum(
        len(candidates(k, d)) for k in KERNELS for d in sorted({s[4] for s in SHAPES if s[5]})
    )
    report["compiles_for_full_sweep"] = total
    print(f"{total} candidate compiles for a full sweep; {bad} problems")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    return 1 if bad else 0


def _kernel_list(text: str) -> tuple[str, ...]:
    names = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in names if k not in KERNELS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown kernels {unknown}; choose from {KERNELS}")
    return names


def main(argv: list[str] | None = None) -> int:
    clock = Clock(0.0)  # imports and CUDA start-up count against the budget too
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="output stem (.json, .csv, _table.json)")
    parser.add_argument("--budget-s", type=float, default=270.0, help="wall-clock budget")
    parser.add_argument("--reserve-s", type=float, default=40.0,
                        help="kept from the sweep for re-timing and the final runs")  # fmt: skip
    parser.add_argument("--rep", type=int, default=100, help="do_bench ms, references")
    parser.add_argument("--sweep-rep", type=int, default=40, help="do_bench ms, candidates")
    parser.add_argument("--no-noncausal", dest="noncausal", action="store_false",
                        help="skip the non-causal D128 S2048 row")  # fmt: skip
    parser.add_argument("--kernels", type=_kernel_list, default=KERNELS,
                        help="comma-separated kernels whose tiles are swept"
                        f" (of {','.join(KERNELS)}; the others keep the table's)")  # fmt: skip
    parser.add_argument("--dry-run", action="store_true", help="CPU: list and check candidates")
    args = parser.parse_args(argv)
    if args.dry_run:
        return dry_run(args)
    if args.out is None:
        parser.error("--out is required")
    clock.deadline = clock.start + args.budget_s
    return measure(args, clock)


if __name__ == "__main__":
    sys.exit(main())
