#!/usr/bin/env python3
"""Experiment: the chunked linear cross-entropy's weight-gradient add with TMA bulk reductions.

Each chunk of GRETA's linear cross-entropy adds ``G^T h`` ([vocab, rows] x [rows, hidden],
K = the chunk's rows) into the whole bf16 weight gradient (``dw.addmm_`` in
``greta_core/ops/linear_cross_entropy.py``). At Liger-Kernel's memory the chunks are 256
rows and that add is bound by the read and write of the gradient: cuBLAS took 0.41 ms at
128256 x 2048 x 256 rows on the H200 where a copy of the gradient takes 0.25 ms, and 18
Triton kernels that load the C tile, add and store were slower still (issue 26). This
kernel never loads C: each tile's product is added by the tensor memory accelerator
(``tensor_descriptor.atomic_add``, ``cp.reduce.async.bulk.tensor ... add`` on sm_90), an
asynchronous reduction done beside memory while the SM goes on to its next tile.

Per shape: cuBLAS ``addmm_``, the kernel under each of CONFIGS, a copy of the gradient (the
memory floor), the relative error of one add against float32, and for the best config the
error of a 32-chunk accumulation (bf16 gradient, as in the op) against float32 beside
cuBLAS's. It is an experiment, not a GRETA op: CUDA with TMA (sm_90+) only; nothing in
greta_core uses it.

    python3 bench/dw_add_tma_reduce.py --out bench/results/h200/dw_add_tma_reduce.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, "") and not any(Path(p, "greta_core").is_dir() for p in sys.path):
    sys.path.insert(0, str(ROOT))  # run from a source checkout without installing


@triton.jit
def dw_add_kernel(
    g_ptr, h_ptr, c_ptr, V, H, R: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_R: tl.constexpr, PROGRAMS: tl.constexpr, FIRST: tl.constexpr,
):  # fmt: skip
    """c[V, H] (+)= g[R, V]^T @ h[R, H]: a store for the first chunk, a TMA reduction after."""
    g_desc = tl.make_tensor_descriptor(g_ptr, [R, V], [V, 1], [BLOCK_R, BLOCK_V])
    h_desc = tl.make_tensor_descriptor(h_ptr, [R, H], [H, 1], [BLOCK_R, BLOCK_H])
    c_desc = tl.make_tensor_descriptor(c_ptr, [V, H], [H, 1], [BLOCK_V, BLOCK_H])
    tiles_h = tl.cdiv(H, BLOCK_H)
    for tile in tl.range(tl.program_id(0), tl.cdiv(V, BLOCK_V) * tiles_h, PROGRAMS):
        v0 = (tile // tiles_h) * BLOCK_V
        h0 = (tile % tiles_h) * BLOCK_H
        acc = tl.zeros((BLOCK_V, BLOCK_H), tl.float32)
        for r in range(0, R, BLOCK_R):
            acc = tl.dot(g_desc.load([r, v0]).T, h_desc.load([r, h0]), acc)
        if FIRST:
            c_desc.store([v0, h0], acc.to(c_ptr.dtype.element_ty))
        else:
            c_desc.atomic_add([v0, h0], acc.to(c_ptr.dtype.element_ty))


# (BLOCK_V, BLOCK_H, BLOCK_R, num_warps, num_stages, programs per SM; 0: one per tile)
CONFIGS = (
    (128, 128, 64, 4, 3, 0), (128, 128, 64, 8, 3, 0), (128, 256, 64, 8, 3, 0),
    (128, 128, 64, 4, 3, 2), (128, 128, 64, 8, 4, 1), (128, 256, 64, 8, 3, 1),
    (64, 256, 64, 4, 3, 2), (128, 64, 64, 4, 4, 2),
)  # fmt: skip
# (vocab, hidden, chunk rows): the LCE grid's 8192-token chunks at Liger's memory and the table's.
SHAPES = (
    (128256, 2048, 256), (128256, 2048, 512), (262144, 2048, 256), (128256, 4096, 512),
    (262144, 4096, 512), (32000, 2048, 512),
)  # fmt: skip
CHUNKS = 32


def programs(vocab: int, hidden: int, config: tuple[int, ...], sms: int) -> int:
    """The launch's program count: one per tile, or `programs per SM` x `sms` persistent ones."""
    block_v, block_h, *_, per_sm = config
    tiles = triton.cdiv(vocab, block_v) * triton.cdiv(hidden, block_h)
    return min(tiles, sms * per_sm) if per_sm else tiles


def launch(
    g: Any, h: Any, c: Any, config: tuple[int, ...], count: int, first: bool = False
) -> None:
    block_v, block_h, block_r, warps, stages, _ = config
    rows, vocab = g.shape
    dw_add_kernel[(count,)](
        g, h, c, vocab, h.shape[1], rows, BLOCK_V=block_v, BLOCK_H=block_h, BLOCK_R=block_r,
        PROGRAMS=count, FIRST=first, num_warps=warps, num_stages=stages,
    )  # fmt: skip


def _err(got: Any, want: Any) -> float:
    return float((got.float() - want).norm() / want.norm())


def measure_shape(vocab: int, hidden: int, rows: int, rep: int) -> dict[str, Any]:
    import torch
    from triton.testing import do_bench

    gen = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape: int, scale: float = 1.0) -> Any:
        x = torch.randn(*shape, generator=gen, device="cuda", dtype=torch.float32) * scale
        return x.to(torch.bfloat16)

    g, h, c0 = randn(rows, vocab, scale=1e-2), randn(rows, hidden), randn(vocab, hidden)
    want = c0.float() + g.float().t() @ h.float()
    flop = 2 * rows * vocab * hidden
    row: dict[str, Any] = {"vocab": vocab, "hidden": hidden, "rows": rows, "failed": {}}

    def bench(fn: Any) -> float:
        return do_bench(fn, warmup=10, rep=rep, return_mode="median")

    c = c0.clone()
    row["cublas_ms"] = bench(lambda: c.addmm_(g.t(), h))
    row["cublas_tflops"] = flop / row["cublas_ms"] / 1e9
    copy = torch.empty_like(c0)
    row["copy_ms"] = bench(lambda: copy.copy_(c0))
    sms = torch.cuda.get_device_properties(g.device).multi_processor_count
    best = None
    for config in CONFIGS:
        count = programs(vocab, hidden, config, sms)
        try:
            c = c0.clone()
            launch(g, h, c, config, count)
            err = _err(c, want)
            ms = bench(lambda c=c, config=config, count=count: launch(g, h, c, config, count))
        except Exception as exc:  # a config this Triton or GPU refuses: recorded, not fatal
            row["failed"][str(config)] = str(exc).splitlines()[0][:160] if str(exc) else repr(exc)
            continue
        row[str(config)] = {"ms": ms, "tflops": flop / ms / 1e9, "rel_err": err}
        if err < 1e-2 and (best is None or ms < best[0]):
            best = (ms, config, count)
    if best is not None:
        row["best_ms"], row["best_config"], count = best
        row["best_vs_cublas"] = row["cublas_ms"] / best[0]
        row["accumulated_rel_err"] = _accumulated(vocab, hidden, rows, best[1], count, randn)
    return row


def _accumulated(
    vocab: int, hidden: int, rows: int, config: tuple[int, ...], count: int, randn: Any
) -> dict[str, float]:
    """CHUNKS adds into one bf16 gradient (the first a store), cuBLAS's and the kernel's,
    each against the float32 sum: the reduction rounds the tile to bf16 before adding."""
    import torch

    parts = [(randn(rows, vocab, scale=1e-2), randn(rows, hidden)) for _ in range(4)]
    ref = torch.zeros(vocab, hidden, device="cuda")
    cublas = torch.empty(vocab, hidden, device="cuda", dtype=torch.bfloat16)
    kernel = torch.empty_like(cublas)
    for i in range(CHUNKS):
        g, h = parts[i % len(parts)]
        ref.addmm_(g.float().t(), h.float())
        cublas.addmm_(g.t(), h, beta=1 if i else 0)
        launch(g, h, kernel, config, count, first=i == 0)
    return {"cublas": _err(cublas, ref), "kernel": _err(kernel, ref)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rep", type=int, default=80, help="do_bench ms")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        print("dw_add_tma_reduce: needs a CUDA GPU with TMA (sm_90 or newer)", file=sys.stderr)
        return 2
    from greta_core.bench.metadata import header
    from greta_core.bench.report import write_json

    # Tensor descriptors made inside a kernel need a scratch allocator.
    triton.set_allocator(
        lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda")
    )
    rows = []
    for shape in SHAPES:
        rows.append(measure_shape(*shape, args.rep))
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "failed"}), flush=True)
    doc = {
        **header("dw_add_tma_reduce", "cuda", "bench/dw_add_tma_reduce.py", argv, args.out),
        "configs": [list(c) for c in CONFIGS],
        "rows": rows,
    }
    write_json(args.out, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
