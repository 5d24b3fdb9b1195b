#!/usr/bin/env python3
"""The Llama block of examples/llama_block.py, tensor-parallel over torch.distributed.

Megatron-style: QKV and gate/up are column-parallel (each rank owns heads/N attention heads
and hidden/N MLP columns), the attention output and down projections are row-parallel,
and one all-reduce per sublayer adds the partial sums. Each shard runs GRETA ops
(``greta_core.compute``); the sharding lives in ``greta_core.distributed``. Rank 0 checks
the result against the single-device block and a plain-PyTorch reference, and times that
block alone beside the tensor-parallel one. On GPUs each is timed eagerly and captured in a
GretaGraph (CUDA/HIP graph, the all-reduces inside it), where decode stops being host-bound.

    torchrun --nproc-per-node 2 examples/llama_block_tp.py            # 2 GPUs (NCCL/RCCL)
    torchrun --nproc-per-node 2 examples/llama_block_tp.py --device cpu   # gloo
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent
if not any(Path(p, "greta_core").is_dir() for p in sys.path):
    sys.path.insert(0, str(HERE.parent))  # a source checkout, not installed
sys.path.insert(0, str(HERE))  # the single-device block this one is checked against

from llama_block import (  # noqa: E402
    TOLERANCE,
    Config,
    LlamaBlock,
    Runner,
    make_weights,
    reference_run,
    rel_error,
)

from greta_core import compute as gc  # noqa: E402
from greta_core import observe  # noqa: E402
from greta_core.distributed import GretaShardingError, all_reduce_, shard_llama_weights  # noqa: E402


class TensorParallelLlamaBlock(LlamaBlock):
    """One rank's shard of LlamaBlock; ``cfg`` holds this rank's heads and MLP width. QKV and
    gate/up are column-parallel (no communication); the output and down projections are
    row-parallel, so their partial products are summed over the ranks: one all-reduce each."""

    def __init__(self, cfg: Config, shard: dict[str, torch.Tensor], group: Any = None) -> None:
        super().__init__(cfg, shard)
        self.group = group

    def reduce(self, partial: torch.Tensor) -> torch.Tensor:
        return all_reduce_(partial, self.group)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--prefill-len", type=int, default=64)
    ap.add_argument("--decode-steps", type=int, default=16)
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=0, help="MLP width (default: 2.75 x dim)")
    ap.add_argument("--dtype", default="auto", help="auto (bf16 on GPU, fp32 on CPU), float32, ...")
    ap.add_argument("--device", default="auto", help="auto (GPU if present) or cpu")
    ap.add_argument("--repeats", type=int, default=5, help="timed repetitions (median kept)")
    ap.add_argument(
        "--modes", default="auto",
        help="eager and/or graph (GretaGraph: the collectives captured with the kernels); "
        "auto: eager,graph on GPUs, eager on the CPU",
    )  # fmt: skip
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="rank 0 writes a JSON result here")
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if [m for m in modes if m not in ("auto", "eager", "graph")] or not modes:
        ap.error(f"--modes: {args.modes!r} (choose from eager, graph)")
    args.mode_list = [m for m in modes if m != "auto"]  # empty: the device's default
    if args.dim % args.heads or args.heads % args.kv_heads or (args.dim // args.heads) % 2:
        ap.error("--dim must split into --heads of even size, and --heads into --kv-heads groups")
    return args


def init_distributed(device_arg: str) -> tuple[int, int, str]:
    """Join the torchrun group: NCCL/RCCL with one GPU per rank, or gloo on the CPU."""
    for key, value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
        os.environ.setdefault(key, value)  # NVLink multicast stays off
    os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
    if "RANK" not in os.environ:
        raise SystemExit("llama_block_tp: start it with torchrun --nproc-per-node N")
    local = int(os.environ.get("LOCAL_RANK", 0))
    use_gpu = device_arg != "cpu" and torch.cuda.is_available()
    if use_gpu:
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
        dist.init_process_group("nccl", device_id=torch.device(device))
    else:
        device = "cpu"
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size(), device


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank, world, device = init_distributed(args.device)
    try:
        code = _main(args, rank, world, device)
        # Every rank reaches teardown together: a gloo rank destroying its group while its
        # peer's last collective was still finishing aborted the peer at exit ("terminate
        # called without an active exception") in about one CPU run in six.
        dist.barrier()
        return code
    finally:
        dist.destroy_process_group()


def _main(args: argparse.Namespace, rank: int, world: int, device: str) -> int:
    dtype = gc.resolve_dtype(args.dtype, device)
    hidden = args.hidden or int(2.75 * args.dim) // 32 * 32
    cfg = Config(args.dim, args.heads, args.kv_heads, hidden, args.prefill_len + args.decode_steps)
    try:
        # Every rank builds the same full weights (same seed) and keeps its shard.
        weights = make_weights(cfg, device, dtype, args.seed)
        shard = shard_llama_weights(
            weights, heads=cfg.heads, kv_heads=cfg.kv_heads, head_dim=cfg.head_dim,
            hidden=cfg.hidden, rank=rank, world=world,
        )  # fmt: skip
    except GretaShardingError as exc:
        if rank == 0:
            print(f"llama_block_tp: {exc}", file=sys.stderr)
        return 2
    # The shard's heads and MLP width; dim shrinks with the heads so head_dim stays the
    # model's (the block reads its input width from x, never from cfg.dim).
    local_cfg = replace(
        cfg,
        dim=cfg.dim // world,
        heads=cfg.heads // world,
        kv_heads=cfg.kv_heads // world,
        hidden=cfg.hidden // world,
    )
    block = TensorParallelLlamaBlock(local_cfg, shard)
    gen = torch.Generator().manual_seed(args.seed + 1)
    prompt = torch.randn(args.batch, args.prefill_len, args.dim, generator=gen).to(device, dtype)
    steps = torch.randn(args.decode_steps, args.batch, 1, args.dim, generator=gen).to(device, dtype)
    modes = args.mode_list or (["eager"] if device == "cpu" else ["eager", "graph"])
    tol = TOLERANCE[dtype]
    reference = reference_run(cfg, weights, prompt, steps) if rank == 0 else []
    failed = torch.zeros(1, device=device)
    rows: dict[str, dict[str, Any]] = {}
    for mode in modes:
        # The same Runner as the single-device example: prefill, then decode steps, each
        # repeated and the median kept; "graph" captures the block, all-reduces included.
        tp = Runner(block, local_cfg, args.batch, device, dtype, args.repeats).run(
            mode, prompt, steps
        )
        timings = torch.tensor([tp["prefill_s"], tp["decode_step_s"]], device=device)
        dist.all_reduce(timings, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
        if rank != 0:
            continue
        # The whole block on rank 0's device alone, timed the same way: what TP buys.
        one = Runner(LlamaBlock(cfg, weights), cfg, args.batch, device, dtype, args.repeats).run(
            mode, prompt, steps
        )
        err_single = rel_error(tp["outputs"], one["outputs"])
        err_ref = rel_error(tp["outputs"], reference)
        ok = err_single <= tol and err_ref <= tol
        failed += 0.0 if ok else 1.0
        rows[mode] = {
            "backend": tp["backend"],
            "prefill_ms": 1e3 * float(timings[0]),
            "decode_step_ms": 1e3 * float(timings[1]),
            "single_device_prefill_ms": 1e3 * one["prefill_s"],
            "single_device_decode_step_ms": 1e3 * one["decode_step_s"],
            "rel_err_vs_single_device": err_single,
            "rel_err_vs_reference": err_ref,
            "match": ok,
        }
    if rank == 0:
        impls = {
            k[8:]: v for k, v in observe.implementations_seen().items() if k.startswith("compute.")
        }
        first = rows[modes[0]]
        row = {
            "world": world,
            "backend": dist.get_backend(),
            "device": torch.cuda.get_device_name(device) if device != "cpu" else "cpu",
            "dtype": str(dtype).replace("torch.", ""),
            "config": asdict(cfg),
            "batch": args.batch,
            "prefill_len": args.prefill_len,
            "decode_steps": args.decode_steps,
            "repeats": args.repeats,
            **{k: v for k, v in first.items() if k != "backend"},  # the first mode's, as before
            "tolerance": tol,
            "match": all(r["match"] for r in rows.values()),
            "modes": rows,
            "implementations": impls,
        }
        for mode, r in rows.items():
            print(
                f"tensor-parallel x{world} {mode} ({row['backend']}, {row['device']}, "
                f"{row['dtype']}): prefill {r['prefill_ms']:.3f} ms, decode "
                f"{r['decode_step_ms']:.3f} ms/step (one device: "
                f"{r['single_device_prefill_ms']:.3f} ms, "
                f"{r['single_device_decode_step_ms']:.3f} ms/step); rel_err vs single-device "
                f"{r['rel_err_vs_single_device']:.2e}, vs reference "
                f"{r['rel_err_vs_reference']:.2e} (tol {tol:.0e})"
            )
        print("implementations: " + ", ".join(f"{k}={v}" for k, v in sorted(impls.items())))
        print("tensor-parallel check " + ("passed" if row["match"] else "FAILED"))
        if args.out:
            now = datetime.datetime.now(datetime.timezone.utc)
            args.out.mkdir(parents=True, exist_ok=True)
            tag = row["device"].replace(" ", "_").replace("/", "_")
            path = args.out / f"llama_block_tp_{tag}_x{world}_{now.strftime('%Y%m%dT%H%M%SZ')}.json"
            path.write_text(
                json.dumps({"date": now.isoformat(timespec="seconds"), **row}, indent=2)
            )
            print(f"wrote {path}")
    dist.all_reduce(failed)  # every rank exits with the verdict
    return 1 if failed.item() else 0


if __name__ == "__main__":
    sys.exit(main())
