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
MODES = ["kernel", "atomic"]  # attention_bwd_dkdv's "dq": the dq kernel or atomic adds


@pytest.mark.parametrize(("hq", "hkv", "sq", "skv", "causal"), CASES)
@pytest.mark.parametrize(("block_m", "block_n"), TILES)
@pytest.mark.parametrize("mode", MODES)
def test_bwd_small_tiles_match_float64(hq, hkv, sq, skv, causal, block_m, block_n, mode) -> None:
    need_triton()
    if not ON_GPU and (block_m, block_n) != (16, 32) and not causal:
        pytest.skip("the non-causal case needs one tile shape under the interpreter")
    dev = "cuda" if ON_GPU else "cpu"
    gen = torch.Generator().manual_seed(sq * 1000 + skv)
    mk = lambda h, s: torch.randn(1, h, s, 64, generator=gen).to(dev, torch.float16)  # noqa: E731
    q, k, v, do = mk(hq, sq), mk(hkv, skv), mk(hkv, skv), mk(hq, sq)
    o, lse = attention_with_lse(q, k, v, causal)
    cfg = {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": 4, "num_stages": 2}
    arch = validate(q, k, v)
    overrides = ({**cfg, "dq": mode}, cfg)
    # Poisoned: an element no kernel writes stays NaN (the atomic dq is zeroed by the plan).
    shapes = bwd.result_shapes(tuple(q.shape), hkv, skv, arch, overrides)
    dq, dk, dv = (torch.full(s, float("nan"), device=dev) for s in shapes)
    bwd.launch(do, q, k, v, o, lse, causal, None, dq, dk, dv, arch, configs=overrides)
    got = [dq, bwd.fold_heads(dk, hkv), bwd.fold_heads(dv, hkv)]
    for name, g, want in zip(("dq", "dk", "dv"), got, _grads64(q, k, v, do, causal), strict=True):
        assert not torch.isnan(g).any(), f"{name}: unwritten elements"
        err = ((g.double().cpu() - want).norm() / want.norm()).item()
        assert err < 1e-2, f"{name}: rel err {err:.2e}"


def test_atomic_mode_launches_one_gradient_kernel_per_kv_head() -> None:
    """The plan behind the table switch: delta, then the atomic kernel over (key blocks,
    B * Hkv) writing per-KV-head dk/dv and accumulating into a zeroed dq; the default plan
    keeps the two kernels over query heads."""
    from greta_core import configs
    from greta_core.kernels import attention_bwd as kernels

    shape, strides = (2, 8, 96, 64), ((1, 1, 1),) * 5
    with configs.Override({"attention_bwd_dkdv": {"dq": "atomic", "BLOCK_N": 32}}):
        p = bwd.plan(shape, (2, 80), strides, True, None, "cpu")
    assert [launch.kernel for launch in p.launches] == [
        kernels.attention_bwd_delta_kernel,
        kernels.attention_bwd_atomic_kernel,
    ]
    assert p.launches[1].grid == (3, 2 * 2)  # ceil(80 / 32) key blocks, B * Hkv
    assert p.launches[1].written() == (1, 2, 0)
    assert "dq" not in p.launches[1].constexprs
    assert [b.shape for b in p.buffers[:3]] == [shape, (2, 2, 80, 64), (2, 2, 80, 64)]
    assert [b.zeroed for b in p.buffers[:3]] == [True, False, False]

    p = bwd.plan(shape, (2, 80), strides, True, None, "cpu")
    assert [launch.kernel for launch in p.launches] == [
        kernels.attention_bwd_delta_kernel,
        kernels.attention_bwd_dkdv_kernel,
        kernels.attention_bwd_dq_kernel,
    ]
    assert [b.shape for b in p.buffers[:3]] == [shape, (2, 8, 80, 64), (2, 8, 80, 64)]
    assert not any(b.zeroed for b in p.buffers)


def test_unknown_dq_mode_is_a_config_error() -> None:
    from greta_core import configs
    from greta_core.errors import ConfigError

    with (
        configs.Override({"attention_bwd_dkdv": {"dq": "split"}}),
        pytest.raises(ConfigError, match="'dq' is 'split'"),
    ):
        bwd.plan((1, 2, 16, 64), (2, 16), ((1, 1, 1),) * 5, True, None, "cpu")


def test_delta_kernel_is_the_row_sum_of_o_times_do() -> None:
    """The preprocess launch alone (the plan's first), on strided bf16 views, ragged rows."""
    need_triton()
    from greta_core.ops._plan import Plan, run

    dev = "cuda" if ON_GPU else "cpu"
    gen = torch.Generator().manual_seed(7)
    big = torch.randn(2, 70, 3, 64, generator=gen).to(dev, torch.bfloat16)
    o = big.transpose(1, 2)  # [2, 3, 70, 64], heads not outermost: strides matter
    do = torch.randn(2, 3, 70, 64, generator=gen).to(dev, torch.bfloat16)
    q = torch.empty_like(do)
    arch = validate(q, q, q)
    full = bwd._plan_for(do, q, q, q, o, True, None, arch)
    delta_only = Plan(full.op, arch, full.buffers, full.launches[:1], (3,))
    (delta,) = run(delta_only, (q, q, q, do, None, o))
    want = (o.double() * do.double()).sum(-1)
    assert delta.dtype == torch.float32 and delta.shape == (2, 3, 70)
    torch.testing.assert_close(delta.double().cpu(), want.cpu(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", MODES)
def test_jax_executor_feeds_delta_to_the_gradient_launches(mode, monkeypatch) -> None:
    """greta_core.jax._plan runs the same plan: the delta launch's output is the array the
    gradient kernels read, and the atomic dq is a zeroed output (jax-triton stubbed: this
    checks the wiring, the H100 run checks the numbers)."""
    import sys
    import types

    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    from greta_core import configs
    from greta_core.jax._plan import run

    calls = []

    def triton_call(*args, kernel, out_shape, grid, input_output_aliases, zeroed_outputs, **kw):
        calls.append((kernel, args, zeroed_outputs))
        return [jnp.full(s.shape, float(len(calls)), s.dtype) for s in out_shape]

    monkeypatch.setitem(sys.modules, "jax_triton", types.SimpleNamespace(triton_call=triton_call))
    shape = (1, 4, 32, 64)
    with configs.Override({"attention_bwd_dkdv": {"dq": mode}}):
        p = bwd.plan(shape, (2, 32), ((1, 1, 1),) * 5, True, None, "sm_90")
    q = jnp.zeros(shape, jnp.bfloat16)
    kv = jnp.zeros((1, 2, 32, 64), jnp.bfloat16)
    lse = jnp.zeros(shape[:3], jnp.float32)
    dq, dk, dv = run(p, (q, kv, kv, q, lse, q))
    assert [c[0] for c in calls] == [launch.kernel for launch in p.launches]
    for _kernel, args, _zeroed in calls[1:]:  # delta (the first call's output, all 1.0)
        assert args[5].shape == shape[:3] and float(args[5].max()) == float(args[5].min()) == 1
    if mode == "atomic":
        assert calls[1][2] == (2,)  # outputs (dk, dv, dq): dq accumulates from zeros
        assert (dk.shape, dv.shape, float(dq.max())) == ((1, 2, 32, 64),) * 2 + (2.0,)
    else:
        assert [c[2] for c in calls[1:]] == [(), ()]
        assert (dk.shape, float(dk.max()), float(dq.max())) == ((1, 4, 32, 64), 2.0, 3.0)


@pytest.mark.parametrize("where", ["q", "k", "v"])
def test_atomic_variant_marks_nan_where_the_two_kernels_do(where: str) -> None:
    """A NaN in one input element reaches the same gradient elements in both variants (the
    masking is shared code); rows and keys far from it stay finite."""
    need_triton()
    dev = "cuda" if ON_GPU else "cpu"
    gen = torch.Generator().manual_seed(11)
    mk = lambda h, s: torch.randn(1, h, s, 64, generator=gen).to(dev, torch.float16)  # noqa: E731
    q, k, v, do = mk(4, 64), mk(2, 64), mk(2, 64), mk(4, 64)
    o, lse = attention_with_lse(q, k, v, True)
    {"q": q, "k": k, "v": v}[where][0, 1, 40, 3] = float("nan")
    arch = validate(q, k, v)
    cfg = {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 2}
    masks = []
    for mode in MODES:
        overrides = ({**cfg, "dq": mode}, cfg)
        shapes = bwd.result_shapes(tuple(q.shape), 2, 64, arch, overrides)
        dq, dk, dv = (torch.zeros(s, device=dev) for s in shapes)
        bwd.launch(do, q, k, v, o, lse, True, None, dq, dk, dv, arch, configs=overrides)
        masks.append([t.isnan().cpu() for t in (dq, bwd.fold_heads(dk, 2), bwd.fold_heads(dv, 2))])
    for name, kernel_mask, atomic_mask in zip(("dq", "dk", "dv"), *masks, strict=True):
        assert torch.equal(kernel_mask, atomic_mask), name
        assert not kernel_mask.all(), name
    assert any(m.any() for m in masks[0])
