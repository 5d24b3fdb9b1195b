#!/usr/bin/env python3
"""A Llama-style decoder block through GRETA ops: prefill + decode, eager / graph / compile.

RMSNorm -> QKV GEMM -> RoPE -> attention with a KV cache -> output projection -> RMSNorm ->
SwiGLU MLP. Every op goes through ``greta_core.compute`` (GRETA Triton kernel, else the vendor
library, else the reference), so this script holds no device-specific code: it runs the same on
a CPU, an NVIDIA GPU and an AMD GPU. Each mode's output is checked against a plain-PyTorch
reference block before its latency and tokens/s are printed.

On a GPU the defaults are a Llama-sized block (dim 2048, eager / graph / compile); on a CPU
a small one (dim 256, eager / graph) that finishes in seconds.

    python examples/llama_block.py
    python examples/llama_block.py --batch 1,8,32 --out bench/results
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import math
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

if __package__ in (None, "") and not any(Path(p, "greta_core").is_dir() for p in sys.path):
    # Run from a source checkout without installing: the repository root holds greta_core.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from greta_core import compute as gc
from greta_core import observe
from greta_core.compile import compile as greta_compile
from greta_core.graph import capture

TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-9, torch.bfloat16: 3e-2, torch.float16: 1e-2}


@dataclass(frozen=True)
class Config:
    dim: int
    heads: int
    kv_heads: int
    hidden: int
    max_seq: int
    eps: float = 1e-5
    theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


def make_weights(
    cfg: Config, device: str, dtype: torch.dtype, seed: int
) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    d, hd = cfg.dim, cfg.head_dim
    qkv = (cfg.heads + 2 * cfg.kv_heads) * hd

    def lin(k: int, n: int) -> torch.Tensor:
        return torch.randn(k, n, generator=gen) / math.sqrt(k)

    w = {
        "attn_norm": 1.0 + 0.1 * torch.randn(d, generator=gen),
        "wqkv": lin(d, qkv),
        "wo": lin(cfg.heads * hd, d),
        "mlp_norm": 1.0 + 0.1 * torch.randn(d, generator=gen),
        "w13": lin(d, 2 * cfg.hidden),
        "w2": lin(cfg.hidden, d),
    }
    return {k: v.to(device=device, dtype=dtype) for k, v in w.items()}


def rope_tables(cfg: Config, device: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    half = cfg.head_dim // 2
    inv = cfg.theta ** (-torch.arange(half, dtype=torch.float64) / half)
    angles = torch.arange(cfg.max_seq, dtype=torch.float64)[:, None] * inv[None, :]
    return angles.cos().to(device, dtype), angles.sin().to(device, dtype)


class LlamaBlock(torch.nn.Module):
    """The block through GretaCompute; the KV cache is passed in and written in place."""

    def __init__(self, cfg: Config, weights: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.cfg = cfg
        for name, value in weights.items():
            self.register_buffer(name, value)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        cache_lens: torch.Tensor,
    ) -> torch.Tensor:
        cfg = self.cfg
        b, s, d = x.shape
        hq, hkv, hd = cfg.heads, cfg.kv_heads, cfg.head_dim
        h = gc.rms_norm(x, self.attn_norm, cfg.eps)
        qkv = gc.matmul(h.reshape(b * s, d), self.wqkv)
        q, k, v = qkv.split([hq * hd, hkv * hd, hkv * hd], dim=-1)
        q = gc.rope(q.reshape(b, s, hq, hd).contiguous(), cos, sin)
        k = gc.rope(k.reshape(b, s, hkv, hd).contiguous(), cos, sin)
        v = v.reshape(b, s, hkv, hd)
        gc.kv_cache_append(
            k_cache,
            v_cache,
            k.transpose(1, 2).contiguous(),
            v.transpose(1, 2).contiguous(),
            cache_lens,
        )
        o = gc.attention(
            q.transpose(1, 2).contiguous(), k_cache, v_cache, causal=True, kv_lens=cache_lens + s
        )
        o = o.transpose(1, 2).reshape(b * s, hq * hd)
        x = x + self.reduce(gc.matmul(o, self.wo)).reshape(b, s, d)
        h = gc.rms_norm(x, self.mlp_norm, cfg.eps)
        gate, up = gc.matmul(h.reshape(b * s, d), self.w13).chunk(2, dim=-1)
        return x + self.reduce(gc.matmul(F.silu(gate) * up, self.w2)).reshape(b, s, d)

    def reduce(self, partial: torch.Tensor) -> torch.Tensor:
        """After the output and down projections: nothing on one device; a tensor-parallel
        shard sums the ranks' partial products here (examples/llama_block_tp.py)."""
        return partial


def reference_run(
    cfg: Config, weights: dict[str, torch.Tensor], prompt: torch.Tensor, steps: torch.Tensor
) -> list[torch.Tensor]:
    """Plain PyTorch, float64 on the CPU / float32 on a GPU, growing KV by concatenation."""
    acc = torch.float64 if prompt.device.type == "cpu" else torch.float32
    w = {k: v.to(acc) for k, v in weights.items()}
    cos_t, sin_t = rope_tables(cfg, str(prompt.device), acc)
    hq, hkv, hd = cfg.heads, cfg.kv_heads, cfg.head_dim

    def norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.eps) * weight

    def rot(x: torch.Tensor, pos: int) -> torch.Tensor:
        c = cos_t[pos : pos + x.shape[1]][None, :, None, :]
        s_ = sin_t[pos : pos + x.shape[1]][None, :, None, :]
        x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
        return torch.cat((x1 * c - x2 * s_, x2 * c + x1 * s_), dim=-1)

    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None
    outputs = []
    pos = 0
    for x in [prompt.to(acc)] + [t.to(acc) for t in steps]:
        b, s, _ = x.shape
        q, k, v = (norm(x, w["attn_norm"]) @ w["wqkv"]).split([hq * hd, hkv * hd, hkv * hd], -1)
        q = rot(q.reshape(b, s, hq, hd), pos).transpose(1, 2)
        k = rot(k.reshape(b, s, hkv, hd), pos).transpose(1, 2)
        v = v.reshape(b, s, hkv, hd).transpose(1, 2)
        keys = k if keys is None else torch.cat((keys, k), dim=2)
        values = v if values is None else torch.cat((values, v), dim=2)
        kr = keys.repeat_interleave(hq // hkv, dim=1)
        vr = values.repeat_interleave(hq // hkv, dim=1)
        scores = q @ kr.transpose(-1, -2) / math.sqrt(hd)
        total = keys.shape[2]
        qpos = torch.arange(pos, pos + s, device=x.device)[:, None]
        scores = scores.masked_fill(torch.arange(total, device=x.device)[None, :] > qpos, -math.inf)
        o = (scores.softmax(-1) @ vr).transpose(1, 2).reshape(b, s, hq * hd)
        x = x + o @ w["wo"]
        gate, up = (norm(x, w["mlp_norm"]) @ w["w13"]).chunk(2, dim=-1)
        outputs.append(x + (F.silu(gate) * up) @ w["w2"])
        pos += s
    return outputs


class Runner:
    """One mode (eager / graph / compile) over the same prompt and decode inputs."""

    def __init__(
        self, block: Any, cfg: Config, batch: int, device: str, dtype: torch.dtype, repeats: int
    ) -> None:
        self.block, self.cfg, self.device, self.repeats = block, cfg, device, max(1, repeats)
        shape = (batch, cfg.kv_heads, cfg.max_seq, cfg.head_dim)
        self.k_cache = torch.zeros(shape, device=device, dtype=dtype)
        self.v_cache = torch.zeros(shape, device=device, dtype=dtype)
        self.lens = torch.zeros(batch, device=device, dtype=torch.int32)
        self.cos, self.sin = rope_tables(cfg, device, dtype)

    def reset(self) -> None:
        self.k_cache.zero_()
        self.v_cache.zero_()
        self.lens.zero_()

    def prefill_fn(self, prompt: torch.Tensor) -> Any:
        p = prompt.shape[1]
        return lambda: self.block(
            prompt, self.cos[:p], self.sin[:p], self.k_cache, self.v_cache, self.lens
        )

    def run(self, mode: str, prompt: torch.Tensor, steps: torch.Tensor) -> dict[str, Any]:
        self.reset()
        p = prompt.shape[1]
        setup = 0.0
        if mode == "graph":
            t0 = time.perf_counter()
            pre = capture(
                self.block,
                prompt,
                self.cos[:p],
                self.sin[:p],
                self.k_cache,
                self.v_cache,
                self.lens,
            )
            gc.synchronize(self.device)
            setup += time.perf_counter() - t0
            run_prefill = pre
        else:
            run_prefill = self.prefill_fn(prompt)
        # Prefill and decode are idempotent for the same cache lengths (the appends rewrite
        # the same positions), so each is repeated and the median time kept.
        prefill_times = []
        for _ in range(self.repeats):
            gc.synchronize(self.device)
            t0 = time.perf_counter()
            out = run_prefill()
            gc.synchronize(self.device)
            prefill_times.append(time.perf_counter() - t0)
        outputs = [out.clone()]
        self.lens.add_(p)
        x_step = steps[0].clone()
        cos_step = self.cos[p : p + 1].clone()
        sin_step = self.sin[p : p + 1].clone()
        step: Any = self.block
        if mode == "graph":
            t0 = time.perf_counter()
            step = capture(
                self.block, x_step, cos_step, sin_step, self.k_cache, self.v_cache, self.lens
            )
            gc.synchronize(self.device)
            setup += time.perf_counter() - t0
        decode_times = []
        for _ in range(self.repeats):
            self.lens.fill_(p)
            decoded = []
            gc.synchronize(self.device)
            t0 = time.perf_counter()
            for i, x in enumerate(steps):
                pos = p + i
                out = step(
                    x,
                    self.cos[pos : pos + 1],
                    self.sin[pos : pos + 1],
                    self.k_cache,
                    self.v_cache,
                    self.lens,
                )
                decoded.append(out.clone())
                self.lens.add_(1)
            gc.synchronize(self.device)
            decode_times.append((time.perf_counter() - t0) / len(steps))
        outputs += decoded
        backend = getattr(step, "backend", "eager")
        return {
            "outputs": outputs,
            "prefill_s": statistics.median(prefill_times),
            "decode_step_s": statistics.median(decode_times),
            "setup_s": setup,
            "backend": backend,
        }


def rel_error(outputs: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    got = torch.cat([o.reshape(-1).double().cpu() for o in outputs])
    want = torch.cat([r.reshape(-1).double().cpu() for r in reference])
    if not torch.isfinite(got).all():
        return math.inf
    return float((got - want).norm() / want.norm())


def git_commit() -> str | None:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
            cwd=Path(__file__).resolve().parent, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


# A GPU runs the Llama-2/3-like block; a CPU a small one, so the first run takes seconds
# (pass the GPU values explicitly to time the full block on a CPU).
GPU_DEFAULTS = dict(batch="1,8", prefill_len=64, decode_steps=32, dim=2048, heads=32, kv_heads=4,
                    modes="eager,graph,compile", repeats=5)  # fmt: skip
CPU_DEFAULTS = dict(batch="1,4", prefill_len=16, decode_steps=4, dim=256, heads=8, kv_heads=2,
                    modes="eager,graph", repeats=2)  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", help="decode batch sizes, comma-separated (GPU 1,8; CPU 1,4)")
    ap.add_argument("--prefill-len", type=int, help="GPU 64, CPU 16")
    ap.add_argument("--decode-steps", type=int, help="GPU 32, CPU 4")
    ap.add_argument("--dim", type=int, help="model width (GPU 2048, CPU 256)")
    ap.add_argument("--heads", type=int, help="GPU 32, CPU 8")
    ap.add_argument("--kv-heads", type=int, help="GPU 4, CPU 2")
    ap.add_argument("--hidden", type=int, default=0, help="MLP width (default: 2.75 x dim)")
    ap.add_argument("--dtype", default="auto", help="auto (bf16 on GPU, fp32 on CPU), float32, ...")
    ap.add_argument("--device", default="auto", help="auto (GPU if present), cpu, cuda")
    ap.add_argument("--modes", help="GPU eager,graph,compile; CPU eager,graph")
    ap.add_argument("--repeats", type=int, help="timed repetitions, median kept (GPU 5, CPU 2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="write CSV + JSON results here")
    args = ap.parse_args(argv)
    args.device = gc.default_device() if args.device == "auto" else args.device
    defaults = CPU_DEFAULTS if args.device == "cpu" else GPU_DEFAULTS
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.dim % args.heads or args.heads % args.kv_heads or (args.dim // args.heads) % 2:
        ap.error("--dim must split into --heads of even size, and --heads into --kv-heads groups")
    try:
        args.batches = [int(b) for b in args.batch.split(",") if b.strip()]
    except ValueError:
        ap.error(f"--batch: expected integers like 1,8,32, got {args.batch!r}")
    args.mode_list = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in args.mode_list if m not in ("eager", "graph", "compile")]
    if bad:
        ap.error(f"--modes: unknown {', '.join(bad)} (choose from eager, graph, compile)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = args.device
    try:
        dtype = gc.resolve_dtype(args.dtype, device)
    except ValueError as exc:
        print(f"llama_block: {exc}", file=sys.stderr)
        return 2
    hidden = args.hidden or int(2.75 * args.dim) // 32 * 32
    cfg = Config(args.dim, args.heads, args.kv_heads, hidden, args.prefill_len + args.decode_steps)
    weights = make_weights(cfg, device, dtype, args.seed)
    block = LlamaBlock(cfg, weights)
    compiled = None
    if "compile" in args.mode_list:
        compiled = greta_compile(block, dynamic=False)
        print(f"compile path: {compiled.backend} ({compiled.reason})")
    tol = TOLERANCE[dtype]
    print(f"device={device} dtype={str(dtype).replace('torch.', '')} config={asdict(cfg)}")
    rows, failed = [], False
    for batch in args.batches:
        gen = torch.Generator().manual_seed(args.seed + batch)
        prompt = torch.randn(batch, args.prefill_len, args.dim, generator=gen).to(device, dtype)
        steps = torch.randn(args.decode_steps, batch, 1, args.dim, generator=gen).to(device, dtype)
        reference = reference_run(cfg, weights, prompt, steps)
        runner = Runner(block, cfg, batch, device, dtype, args.repeats)
        for mode in args.mode_list:
            fn = compiled if mode == "compile" else block
            runner.block = fn
            runner.run(mode, prompt, steps)  # warm-up pass: lazy init, Triton/compile caches
            result = runner.run(mode, prompt, steps)
            err = rel_error(result["outputs"], reference)
            ok = err <= tol
            failed |= not ok
            backend = compiled.backend if mode == "compile" and compiled else result["backend"]
            row = {
                "batch": batch,
                "mode": mode,
                "backend": backend,
                "prefill_len": args.prefill_len,
                "decode_steps": args.decode_steps,
                "prefill_ms": 1e3 * result["prefill_s"],
                "prefill_tok_s": batch * args.prefill_len / result["prefill_s"],
                "decode_step_ms": 1e3 * result["decode_step_s"],
                "decode_tok_s": batch / result["decode_step_s"],
                "setup_s": result["setup_s"],
                "rel_err": err,
                "tolerance": tol,
                "match": ok,
            }
            rows.append(row)
            print(
                f"batch={batch:<4} {mode:8} ({backend:10}) ref {'ok  ' if ok else 'FAIL'} "
                f"rel_err={err:.2e}  prefill {row['prefill_ms']:9.3f} ms "
                f"{row['prefill_tok_s']:11.1f} tok/s  decode {row['decode_step_ms']:8.3f} ms/step "
                f"{row['decode_tok_s']:10.1f} tok/s"
            )
    impls = {k: v for k, v in observe.implementations_seen().items() if k.startswith("compute.")}
    print("implementations: " + ", ".join(f"{k[8:]}={v}" for k, v in sorted(impls.items())))
    print("reference check FAILED" if failed else "reference check passed")
    if args.out:
        write_results(args, cfg, device, dtype, rows, impls, compiled)
    return 1 if failed else 0


def write_results(
    args: argparse.Namespace, cfg: Config, device: str, dtype: torch.dtype,
    rows: list[dict[str, Any]], impls: dict[str, str], compiled: Any,
) -> None:  # fmt: skip
    from greta_core.compute.device import describe

    now = datetime.datetime.now(datetime.timezone.utc)
    meta = {
        **describe(device),
        "dtype": str(dtype).replace("torch.", ""),
        "date": now.isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "config": asdict(cfg),
        "argv": sys.argv[1:],
        "implementations": impls,
        "compile_backend": getattr(compiled, "backend", None),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    tag = (meta.get("gpu") or "cpu").replace(" ", "_").replace("/", "_")
    stem = args.out / f"llama_block_{tag}_{now.strftime('%Y%m%dT%H%M%SZ')}"
    stem.with_suffix(".json").write_text(json.dumps({"metadata": meta, "results": rows}, indent=2))
    with stem.with_suffix(".csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["gpu", "dtype", "git_commit", *rows[0].keys()])
        writer.writeheader()
        for row in rows:
            writer.writerow({"gpu": meta.get("gpu") or "cpu", "dtype": meta["dtype"],
                             "git_commit": meta["git_commit"], **row})  # fmt: skip
    print(f"wrote {stem}.json and .csv")


if __name__ == "__main__":
    sys.exit(main())
