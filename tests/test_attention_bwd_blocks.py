"""Attention backward kernels with tiles small enough that a tiny problem has key and query
blocks of every kind: on the causal diagonal, seen in full (the unmasked loops), ragged at
the sequence end, and (Sq > Skv) rows that see no key at all."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from _kernel_testing import ON_GPU, need_triton  # noqa: E402

from greta_core.ops import attention_bwd as bwd  # noqa: E402
from greta_core.ops.attention import attention_with_lse, validate  # noqa: E402


def _grads64(q, k, v, do, causal: bool):
    """float64 autograd of softmax(q k^T / sqrt(D)) v, queries at Skv - Sq + i."""
    leaves = [t.detach().double().cpu().requires_grad_() for t in (q, k, v)]
    qq, kk, vv = leaves
    group = qq.shape[1] // kk.shape[1]
    kk, vv = kk.repeat_interleave(group, 1), vv.repeat_interleave(group, 1)
    sq, skv = qq.shape[2], kk.shape[2]
    s = qq @ kk.transpose(-1, -2) / math.sqrt(qq.shape[3])
    pos = torch.arange(sq)[:, None] + (skv - sq)
    visible = torch.arange(skv)[None, :] <= pos if causal else torch.ones(sq, skv, dtype=bool)
    s = s.masked_fill(~visible, float("-inf"))
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m)).detach()
    e = torch.exp(s - m)
    p = e / e.sum(-1, keepdim=True).clamp_min(1e-300)
    (p @ vv).backward(do.double().cpu())
    return [t.grad for t in leaves]


CASES = [
    # (Hq, Hkv, Sq, Skv, causal)
    (2, 1, 64, 64, True),  # whole blocks: diagonal + interior
    (2, 2, 50, 50, True),  # ragged last query and key block
    (2, 1, 40, 72, True),  # chunked prefill: queries are the last 40 positions
    (2, 2, 72, 40, True),  # the first 32 query rows see no key
    (2, 1, 48, 56, False),
]
TILES = [(16, 16), (16, 32), (32, 16)]  # (BLOCK_M, BLOCK_N) of both kernels


@pytest.mark.parametrize(("hq", "hkv", "sq", "skv", "causal"), CASES)
@pytest.mark.parametrize(("block_m", "block_n"), TILES)
def test_bwd_small_tiles_match_float64(hq, hkv, sq, skv, causal, block_m, block_n) -> None:
    need_triton()
    if not ON_GPU and (block_m, block_n) != (16, 32) and not causal:
        pytest.skip("the non-causal case needs one tile shape under the interpreter")
    dev = "cuda" if ON_GPU else "cpu"
    gen = torch.Generator().manual_seed(sq * 1000 + skv)
    mk = lambda h, s: torch.randn(1, h, s, 64, generator=gen).to(dev, torch.float16)  # noqa: E731
    q, k, v, do = mk(hq, sq), mk(hkv, skv), mk(hkv, skv), mk(hq, sq)
    o, lse = attention_with_lse(q, k, v, causal)
    delta = (o.float() * do.float()).sum(-1).contiguous()
    cfg = {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": 4, "num_stages": 2}
    arch = validate(q, k, v)
    dq = torch.full((1, hq, sq, 64), float("nan"), device=dev)
    dk = torch.full((1, hq, skv, 64), float("nan"), device=dev)
    dv = torch.full((1, hq, skv, 64), float("nan"), device=dev)
    bwd.launch(do, q, k, v, lse, delta, causal, None, dq, dk, dv, arch, configs=(cfg, cfg))
    got = [dq, bwd.fold_heads(dk, hkv), bwd.fold_heads(dv, hkv)]
    for name, g, want in zip(("dq", "dk", "dv"), got, _grads64(q, k, v, do, causal), strict=True):
        assert not torch.isnan(g).any(), f"{name}: unwritten elements"
        err = ((g.double().cpu() - want).norm() / want.norm()).item()
        assert err < 1e-2, f"{name}: rel err {err:.2e}"
