#!/usr/bin/env python3
"""Experiment: Triton's automatic warp specialisation on sm_90 for the attention kernels.

``tl.range(..., warp_specialize=True)`` is documented as Blackwell-only, yet Triton 3.6's
NVIDIA backend runs a Hopper pass (``add_hopper_warpspec``) for sm_90 too: with tensor
descriptor (TMA) loads and ``num_warps=4`` it splits a loop into one producer warp group
issuing the loads and two consumer warp groups (12 warps), the structure FlashAttention-3
and cuDNN use on Hopper, which GRETA's kernels lack. This script writes GRETA's three
attention kernels (forward, backward dk/dv, backward dq) in that form and, for each tile
config, records what the compiler and the GPU do with it, beside GRETA's table kernel on
the same inputs:

- ``compile-error``: the pass aborts (a failed assertion ends the process);
- ``hang``: the launch does not finish within ``--timeout-s``;
- ``wrong``: outputs differ from GRETA's kernel (relative norm over 1e-2, or non-finite);
- ``ok``: both are timed with ``triton.testing.do_bench`` (median).

Every config runs in its own process, so an abort or a hang costs one row, not the run.
It is an experiment, not a GRETA op: causal, Sq == Skv, contiguous [B, H, S, D], S a
multiple of the tiles, bf16; nothing in greta_core uses it.

    python3 bench/attention_autows.py --out bench/results/h100/attention_autows.json
    python3 bench/attention_autows.py --dry-run   # CPU: compile each config for sm_90 only
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)

# (kernel, D, BLOCK_M, BLOCK_N, num_stages): the FlashAttention-3 layout first (128 query
# rows per program: two 64-row consumer groups), then the 64-row tiles the pass accepts.
CONFIGS: list[tuple[str, int, int, int, int]] = [
    ("fwd", 128, 128, 64, 2),
    ("fwd", 128, 128, 128, 2),
    ("fwd", 128, 64, 64, 2),
    ("fwd", 128, 64, 128, 2),
    ("fwd", 64, 128, 64, 2),
    ("fwd", 64, 64, 64, 2),
    ("fwd", 64, 64, 128, 2),
    ("dkdv", 128, 64, 128, 2),
    ("dkdv", 128, 64, 64, 2),
    ("dkdv", 64, 64, 128, 2),
    ("dkdv", 64, 64, 64, 2),
    ("dq", 128, 128, 64, 2),
    ("dq", 128, 64, 64, 2),
    ("dq", 128, 64, 64, 3),
    ("dq", 64, 64, 64, 2),
    ("dq", 64, 64, 64, 3),
]
# (B, Hq, Hkv, S): the issue-13 MHA shape at S2048; every config runs at its own D.
SHAPE = (4, 32, 32, 2048)
MAX_REL = 1e-2


@triton.jit
def fwd_kernel(
    desc_q, desc_k, desc_v, o_ptr, lse_ptr, sm_scale, S, H_Q, GROUP,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """One loop over the visible key blocks (a second loop after a warp-specialised one
    fails the pass's dominance check), the causal mask on every block."""
    pid_m = tl.cdiv(S, BLOCK_M) - 1 - tl.program_id(0)
    pid_bh = tl.program_id(1)
    h_kv = (pid_bh % H_Q) // GROUP
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    q_row = pid_bh * S + start_m
    kv_row0 = ((pid_bh // H_Q) * (H_Q // GROUP) + h_kv) * S
    q = desc_q.load([q_row, 0])
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
    qk_scale = sm_scale * LOG2E
    for start_n in tl.range(0, start_m + BLOCK_M, BLOCK_N, warp_specialize=True):
        k = desc_k.load([kv_row0 + start_n, 0])
        qk = tl.dot(q, k.T)
        qk = tl.where((start_n + offs_n0)[None, :] <= offs_m[:, None], qk * qk_scale, -1.0e6)
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = desc_v.load([kv_row0 + start_n, 0])
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    out = acc / l_i[:, None]
    # Pointer stores: the pass splits the rows between the consumer groups, and a
    # descriptor store of the whole tile then fails to verify.
    offs_d = tl.arange(0, HEAD_DIM)
    rows = (pid_bh * S + offs_m).to(tl.int64)
    tl.store(o_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :], out.to(o_ptr.dtype.element_ty))
    tl.store(lse_ptr + rows, (m_i + tl.math.log2(l_i)) * 0.6931471805599453)


@triton.jit
def dkdv_kernel(
    desc_q, desc_k, desc_v, desc_do, lse_ptr, delta_ptr, dk_ptr, dv_ptr, sm_scale, S, H_Q,
    GROUP, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """One program per (key block, batch, KV head); one flat loop over the GQA group's
    query heads and the query blocks that see the keys (GRETA's dkdv walk)."""
    pid_bkv = tl.program_id(1)
    h_kv = pid_bkv % (H_Q // GROUP)
    start_n = tl.program_id(0) * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    kv_row = pid_bkv * S + start_n
    k = desc_k.load([kv_row, 0])
    v = desc_v.load([kv_row, 0])
    qk_scale = sm_scale * LOG2E
    dk = tl.zeros((BLOCK_N, HEAD_DIM), dtype=tl.float32)
    dv = tl.zeros((BLOCK_N, HEAD_DIM), dtype=tl.float32)
    lo = start_n // BLOCK_M * BLOCK_M
    n_blocks = (S - lo) // BLOCK_M
    row_h0 = ((pid_bkv // (H_Q // GROUP)) * H_Q + h_kv * GROUP) * S
    for i in tl.range(0, n_blocks * GROUP, warp_specialize=True):
        g = i // n_blocks
        start_m = lo + (i - g * n_blocks) * BLOCK_M
        row = row_h0 + g * S + start_m
        q = desc_q.load([row, 0])
        do = desc_do.load([row, 0])
        offs_m = start_m + tl.arange(0, BLOCK_M)
        lse2 = tl.load(lse_ptr + row + tl.arange(0, BLOCK_M)) * LOG2E
        delta = tl.load(delta_ptr + row + tl.arange(0, BLOCK_M))
        p_t = tl.math.exp2(tl.dot(k, q.T) * qk_scale - lse2[None, :])
        p_t = tl.where(offs_n[:, None] <= offs_m[None, :], p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv)
        ds_t = p_t * (tl.dot(v, do.T) - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk)
    offs_d = tl.arange(0, HEAD_DIM)
    ptrs = (kv_row + tl.arange(0, BLOCK_N)).to(tl.int64)[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(dk_ptr + ptrs, (dk * sm_scale).to(dk_ptr.dtype.element_ty))
    tl.store(dv_ptr + ptrs, dv.to(dv_ptr.dtype.element_ty))


@triton.jit
def dq_kernel(
    desc_q, desc_k, desc_v, desc_do, lse_ptr, delta_ptr, dq_ptr, sm_scale, S, H_Q, GROUP,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    pid_m = tl.cdiv(S, BLOCK_M) - 1 - tl.program_id(0)
    pid_bh = tl.program_id(1)
    h_kv = (pid_bh % H_Q) // GROUP
    start_m = pid_m * BLOCK_M
    row = pid_bh * S + start_m
    offs_m = start_m + tl.arange(0, BLOCK_M)
    rows = row + tl.arange(0, BLOCK_M)
    q = desc_q.load([row, 0])
    do = desc_do.load([row, 0])
    lse2 = tl.load(lse_ptr + rows) * LOG2E
    delta = tl.load(delta_ptr + rows)
    qk_scale = sm_scale * LOG2E
    kv_row0 = ((pid_bh // H_Q) * (H_Q // GROUP) + h_kv) * S
    dq = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in tl.range(0, start_m + BLOCK_M, BLOCK_N, warp_specialize=True):
        k = desc_k.load([kv_row0 + start_n, 0])
        v = desc_v.load([kv_row0 + start_n, 0])
        p = tl.math.exp2(tl.dot(q, k.T) * qk_scale - lse2[:, None])
        p = tl.where((start_n + offs_n0)[None, :] <= offs_m[:, None], p, 0.0)
        ds = p * (tl.dot(do, v.T) - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)
    offs_d = tl.arange(0, HEAD_DIM)
    ptrs = rows.to(tl.int64)[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(dq_ptr + ptrs, (dq * sm_scale).to(dq_ptr.dtype.element_ty))


KERNELS = {"fwd": fwd_kernel, "dkdv": dkdv_kernel, "dq": dq_kernel}


def label(cfg: tuple[str, int, int, int, int]) -> str:
    kernel, d, bm, bn, stages = cfg
    return f"{kernel} D{d} {bm}x{bn} s{stages}"


def signature(kernel: str, d: int, bm: int, bn: int) -> dict[str, str]:
    sig = {
        "desc_q": f"tensordesc<bf16[{bm},{d}]>",
        "desc_k": f"tensordesc<bf16[{bn},{d}]>",
        "desc_v": f"tensordesc<bf16[{bn},{d}]>",
    }
    if kernel == "fwd":
        sig.update({"o_ptr": "*bf16", "lse_ptr": "*fp32"})
    else:
        sig.update({"desc_do": f"tensordesc<bf16[{bm},{d}]>", "lse_ptr": "*fp32",
                    "delta_ptr": "*fp32"})  # fmt: skip
        sig.update(
            {"dk_ptr": "*bf16", "dv_ptr": "*bf16"} if kernel == "dkdv" else {"dq_ptr": "*bf16"}
        )
    sig.update({"sm_scale": "fp32", "S": "i32", "H_Q": "i32", "GROUP": "i32"})
    sig.update({"HEAD_DIM": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr"})
    return sig


def compile_only(cfg: tuple[str, int, int, int, int]) -> dict[str, Any]:
    """Compile for sm_90 without a GPU: did the warp-specialised form come out, with how
    many warps and how much shared memory."""
    from triton.backends.compiler import GPUTarget

    kernel, d, bm, bn, stages = cfg
    src = triton.compiler.ASTSource(
        fn=KERNELS[kernel], signature=signature(kernel, d, bm, bn),
        constexprs={"HEAD_DIM": d, "BLOCK_M": bm, "BLOCK_N": bn},
    )  # fmt: skip
    compiled = triton.compile(
        src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": stages}
    )
    ttgir = compiled.asm["ttgir"]
    return {
        "status": "compiled",
        "warp_specialized": "ttg.warp_specialize(" in ttgir,
        "num_warps": compiled.metadata.num_warps,
        "shared_bytes": compiled.metadata.shared,
    }


def run_on_gpu(cfg: tuple[str, int, int, int, int], rep: int) -> dict[str, Any]:
    """GRETA's table kernel and the warp-specialised one on the same inputs."""
    import torch
    from triton.tools.tensor_descriptor import TensorDescriptor

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from attention_sweep import Problem, bench_ms, rel_diff

    from greta_core import configs
    from greta_core.arch import device_arch
    from greta_core.kernels.attention import features
    from greta_core.ops import attention_bwd as bwd

    kernel, d, bm, bn, stages = cfg
    b, hq, hkv, s = SHAPE
    arch = device_arch()
    prob = Problem((b, hq, hkv, s, d, True), arch)
    if kernel == "fwd":
        table = configs.lookup("attention", arch, features(d, s, s, True))
    else:
        table = bwd.kernel_configs(arch, d)[0 if kernel == "dkdv" else 1]
    greta = prob.launcher(kernel, table)
    greta()
    want = prob.outputs(kernel)
    row: dict[str, Any] = {"greta_config": table, "greta_ms": round(bench_ms(greta, rep), 4)}

    def desc(t: Any, rows: int) -> Any:
        flat = t.view(-1, d)
        return TensorDescriptor(flat, list(flat.shape), list(flat.stride()), [rows, d])

    scale, group = 1.0 / math.sqrt(d), hq // hkv
    descs = (desc(prob.q, bm), desc(prob.k, bn), desc(prob.v, bn))
    if kernel == "fwd":
        outs = [torch.full_like(prob.q, float("nan")), torch.full_like(prob.lse, float("nan"))]
        args, grid = (*descs, *outs), (s // bm, b * hq)
    else:
        rows = (desc(prob.do, bm), prob.lse, prob.delta)
        if kernel == "dkdv":
            outs = [torch.full_like(prob.k, float("nan")), torch.full_like(prob.v, float("nan"))]
            grid = (s // bn, b * hkv)
        else:
            outs = [torch.full_like(prob.q, float("nan"))]
            grid = (s // bm, b * hq)
        args = (*descs, *rows, *outs)

    def launch() -> None:
        KERNELS[kernel][grid](*args, scale, s, hq, group, HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn,
                              num_warps=4, num_stages=stages)  # fmt: skip

    print("launching", flush=True)  # the parent reads a hang from here on
    launch()
    torch.cuda.synchronize()
    err = rel_diff(outs, want)
    row["rel_diff_vs_greta"] = err if math.isfinite(err) else "inf"
    if not err <= MAX_REL:
        row["status"] = "wrong"
        return row
    row["ws_ms"] = round(bench_ms(launch, rep), 4)
    row["status"] = "ok"
    row["greta_over_ws"] = round(row["greta_ms"] / row["ws_ms"], 3)
    return row


def child(cfg: tuple[str, int, int, int, int], dry: bool, rep: int) -> int:
    result = compile_only(cfg) if dry else run_on_gpu(cfg, rep)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def classify(returncode: int | None, stdout: str, stderr: str) -> dict[str, Any]:
    """A child's row from how it ended: its RESULT line, or why there is none."""
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    if returncode is None:
        where = "launch" if "launching" in stdout else "compile or set-up"
        return {"status": "hang", "detail": f"no result within the time limit ({where})"}
    lines = [ln for ln in stderr.splitlines() if "Assertion" in ln or "error:" in ln]
    if not lines:
        lines = [ln for ln in stderr.splitlines() if ln.strip()][-1:]
    detail = lines[0].strip()[:240] if lines else f"exit code {returncode}"
    return {"status": "compile-error", "detail": detail}


def run_child(
    cfg: tuple[str, int, int, int, int], dry: bool, rep: int, timeout_s: float
) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", ",".join(map(str, cfg)), "--rep", str(rep)]
    cmd += ["--dry-run"] if dry else []
    # A real compile: TRITON_INTERPRET=1 (the CPU tests set it; on a CPU-only machine
    # `greta install`'s environment fixes set it in every Python that does not set it
    # itself) would hand triton.compile an interpreted function.
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout_s)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        code = None
    row = classify(code, out, err)
    row["seconds"] = round(time.monotonic() - start, 1)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="JSON results (required on a GPU)")
    parser.add_argument("--dry-run", action="store_true", help="compile for sm_90 only (CPU)")
    parser.add_argument("--rep", type=int, default=100, help="do_bench ms")
    parser.add_argument("--timeout-s", type=float, default=60.0, help="per config")
    parser.add_argument("--only", default="", help="comma-separated indices into CONFIGS")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        kernel, *nums = args.child.split(",")
        return child((kernel, *map(int, nums)), args.dry_run, args.rep)  # type: ignore[arg-type]
    if not args.dry_run and args.out is None:
        parser.error("--out is required unless --dry-run")
    picked = [CONFIGS[int(i)] for i in args.only.split(",")] if args.only else CONFIGS
    rows = []
    for cfg in picked:
        row = {"config": label(cfg), **run_child(cfg, args.dry_run, args.rep, args.timeout_s)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\n{'config':24} {'status':14} greta ms   ws ms   greta/ws")
    for row in rows:
        print(f"{row['config']:24} {row['status']:14} {row.get('greta_ms', ''):>8} "
              f"{row.get('ws_ms', ''):>7} {row.get('greta_over_ws', ''):>8}")  # fmt: skip
    if args.out is not None:
        from greta_core.bench.metadata import header
        from greta_core.bench.report import write_json

        device = "cpu" if args.dry_run else "cuda"
        doc = {
            **header("attention_autows", device, "bench/attention_autows.py", argv, args.out),
            "shape": dict(zip(("B", "Hq", "Hkv", "S"), SHAPE, strict=True)),
            "rows": rows,
        }  # fmt: skip
        write_json(args.out, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
