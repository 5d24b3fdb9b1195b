"""Attention backward kernels with tiles small enough that a tiny problem has key and query
blocks of every kind: on the causal diagonal, seen in full (the unmasked loops), ragged at
the sequence end, and (Sq > Skv) rows that see no key at all."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from _kernel_testing import ON_GPU, need_triton  # noqa: E402

from greta_core.kernels import attention_bwd as kernels  # noqa: E402
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
    cfg = {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": 4, "num_stages": 2}
    arch = validate(q, k, v)
    # Poisoned: an element no kernel writes stays NaN.
    shapes = bwd.result_shapes(tuple(q.shape), hkv, skv, arch, (cfg, cfg))
    assert shapes == (q.shape, k.shape, v.shape)
    dq, dk, dv = got = [torch.full(s, float("nan"), device=dev, dtype=q.dtype) for s in shapes]
    bwd.launch(do, q, k, v, o, lse, causal, None, dq, dk, dv, arch, configs=(cfg, cfg))
    for name, g, want in zip(("dq", "dk", "dv"), got, _grads64(q, k, v, do, causal), strict=True):
        assert not torch.isnan(g).any(), f"{name}: unwritten elements"
        err = ((g.double().cpu() - want).norm() / want.norm()).item()
        assert err < 1e-2, f"{name}: rel err {err:.2e}"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_plan_launches_delta_then_the_two_gradient_kernels(dtype: str) -> None:
    """delta, then dkdv over (key blocks, B * Hkv) and dq over (query blocks, B * Hq); the
    results in the inputs' dtype, dk/dv per KV head (no fp32 gradient, no per-query-head
    buffer); nothing zeroed (every element is written)."""
    from greta_core import configs
    from greta_core.kernels import attention_bwd as kernels

    shape, strides = (2, 8, 96, 64), ((1, 1, 1),) * 5
    with configs.Override(
        {"attention_bwd_dkdv": {"BLOCK_N": 32}, "attention_bwd_dq": {"BLOCK_M": 64}}
    ):
        p = bwd.plan(shape, (2, 80), strides, dtype, True, None, "cpu")
    assert [launch.kernel for launch in p.launches] == [
        kernels.attention_bwd_delta_kernel,
        kernels.attention_bwd_dkdv_kernel,
        kernels.attention_bwd_dq_kernel,
    ]
    assert p.launches[1].grid == (3, 2 * 2)  # ceil(80 / 32) key blocks, B * Hkv
    assert p.launches[2].grid == (2, 2 * 8)  # ceil(96 / 64) query blocks, B * Hq
    assert [launch.written() for launch in p.launches] == [(3,), (1, 2), (0,)]
    assert p.results == (0, 1, 2)
    assert [b.shape for b in p.buffers[:3]] == [shape, (2, 2, 80, 64), (2, 2, 80, 64)]
    assert [b.dtype for b in p.buffers] == [dtype, dtype, dtype, "float32"]  # delta: fp32
    assert not any(b.zeroed for b in p.buffers)


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


@pytest.mark.parametrize("jax_triton_version", ["0.3.1", "0.4.1"])
def test_jax_executor_feeds_delta_to_the_gradient_launches(
    monkeypatch, jax_triton_version: str
) -> None:
    """greta_core.jax._plan runs the same plan: the delta launch's output is the array the
    gradient kernels read (jax-triton stubbed, in either release's calling form: this checks
    the wiring, the H100 run checks the numbers)."""
    import sys
    import types

    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    from greta_core.jax._plan import run

    calls = []

    def triton_call(*args, kernel, out_shape, grid, input_output_aliases=None, zeroed_outputs=(), **kw):  # fmt: skip
        calls.append((kernel, args, zeroed_outputs))
        return [jnp.full(s.shape, float(len(calls)), s.dtype) for s in out_shape]

    stub = types.SimpleNamespace(triton_call=triton_call, __version__=jax_triton_version)
    monkeypatch.setitem(sys.modules, "jax_triton", stub)
    shape = (1, 4, 32, 64)
    p = bwd.plan(shape, (2, 32), ((1, 1, 1),) * 5, "bfloat16", True, None, "sm_90")
    q = jnp.zeros(shape, jnp.bfloat16)
    kv = jnp.zeros((1, 2, 32, 64), jnp.bfloat16)
    lse = jnp.zeros(shape[:3], jnp.float32)
    dq, dk, dv = run(p, (q, kv, kv, q, lse, q))
    assert [c[0] for c in calls] == [launch.kernel for launch in p.launches]
    for _kernel, args, _zeroed in calls[1:]:  # delta (the first call's output, all 1.0)
        assert args[5].shape == shape[:3] and float(args[5].max()) == float(args[5].min()) == 1
    assert [c[2] for c in calls[1:]] == [(), ()]
    assert (dk.shape, dv.shape) == ((1, 2, 32, 64),) * 2  # per KV head
    assert (dq.dtype, dk.dtype, dv.dtype) == (jnp.bfloat16,) * 3
    assert (float(dk.max()), float(dv.max()), float(dq.max())) == (2.0, 2.0, 3.0)


@pytest.mark.parametrize("where", ["q", "k", "v"])
def test_nan_input_reaches_the_gradients_of_its_group_only(where: str) -> None:
    """A NaN in one input element reaches the gradient that depends on it directly (dq of
    its query row, dk of its key) and stays within its GQA group: the other KV head's dk/dv
    and its query heads' dq stay finite."""
    need_triton()
    dev = "cuda" if ON_GPU else "cpu"
    gen = torch.Generator().manual_seed(11)
    mk = lambda h, s: torch.randn(1, h, s, 64, generator=gen).to(dev, torch.float16)  # noqa: E731
    q, k, v, do = mk(4, 64), mk(2, 64), mk(2, 64), mk(4, 64)
    o, lse = attention_with_lse(q, k, v, True)
    # Query head 1 and KV head 0 (query heads 0 and 1) are the poisoned group.
    {"q": q, "k": k, "v": v}[where][0, 1 if where == "q" else 0, 40, 3] = float("nan")
    arch = validate(q, k, v)
    cfg = {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 2}
    shapes = bwd.result_shapes(tuple(q.shape), 2, 64, arch, (cfg, cfg))
    dq, dk, dv = (torch.zeros(s, device=dev, dtype=q.dtype) for s in shapes)
    bwd.launch(do, q, k, v, o, lse, True, None, dq, dk, dv, arch, configs=(cfg, cfg))
    dq, dk, dv = (t.cpu() for t in (dq, dk, dv))
    hit = dq[0, 1, 40] if where == "q" else dk[0, 0, 40]
    assert hit.isnan().any(), where
    assert dq[0, 2:].isfinite().all()
    assert dk[0, 1].isfinite().all() and dv[0, 1].isfinite().all()


@pytest.mark.parametrize(
    ("hq", "hkv", "sq", "skv"),
    [(4, 2, 40, 40), (4, 1, 24, 40)],  # GROUP 2; GROUP 4 with the queries the last 24 keys
)
def test_dkdv_sums_every_query_head_of_its_group(hq, hkv, sq, skv) -> None:
    """One dkdv program per KV head sums the dk/dv of all GROUP query heads reading it: the
    per-KV-head result against float64 autograd through repeat_interleave'd k and v."""
    need_triton()
    dev = "cuda" if ON_GPU else "cpu"
    gen = torch.Generator().manual_seed(hq * 100 + hkv)
    mk = lambda h, s: torch.randn(1, h, s, 64, generator=gen).to(dev, torch.bfloat16)  # noqa: E731
    q, k, v, do = mk(hq, sq), mk(hkv, skv), mk(hkv, skv), mk(hq, sq)
    o, lse = attention_with_lse(q, k, v, True)
    arch = validate(q, k, v)
    cfg = {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 2}
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    bwd.launch(do, q, k, v, o, lse, True, None, dq, dk, dv, arch, configs=(cfg, cfg))
    want = _grads64(q, k, v, do, True)
    for name, g, w in zip(("dq", "dk", "dv"), (dq, dk, dv), want, strict=True):
        assert not torch.isnan(g).any(), f"{name}: unwritten elements"
        err = ((g.double().cpu() - w).norm() / w.norm()).item()
        assert err < 1e-2, f"{name}: rel err {err:.2e}"
    # Every query head of the group matters: one head's share alone is far off the sum.
    one = _grads64(q[:, :: hq // hkv], k, v, do[:, :: hq // hkv], True)[1]
    assert ((one - want[1]).norm() / want[1].norm()).item() > 0.3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gradients_are_the_fp32_accumulators_rounded_once(dtype) -> None:
    """The same launches into fp32 buffers give the kernels' fp32 accumulators; the plan's
    own buffers (the inputs' dtype) hold exactly those values rounded to nearest even, as
    an fp32 store followed by torch's ``.to(dtype)`` would."""
    need_triton()
    from dataclasses import replace

    from greta_core.ops._plan import run

    dev = "cuda" if ON_GPU else "cpu"
    gen = torch.Generator().manual_seed(5)
    mk = lambda h, s: torch.randn(1, h, s, 64, generator=gen).to(dev, dtype)  # noqa: E731
    q, k, v, do = mk(4, 40), mk(2, 40), mk(2, 40), mk(4, 40)
    o, lse = attention_with_lse(q, k, v, True)
    arch = validate(q, k, v)
    cfg = {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 2}
    p = bwd._plan_for(do, q, k, v, o, True, None, arch, (cfg, cfg))
    assert [p.buffers[i].dtype for i in p.results] == [str(dtype).split(".")[-1]] * 3
    wide = tuple(
        replace(b, dtype="float32") if i in p.results else b for i, b in enumerate(p.buffers)
    )
    inputs = (q, k, v, do, lse, o)
    got = run(p, inputs)
    exact = run(replace(p, buffers=wide), inputs)
    for name, g, e in zip(("dq", "dk", "dv"), got, exact, strict=True):
        assert (g.dtype, e.dtype) == (dtype, torch.float32)
        assert torch.equal(g.view(torch.int16), e.to(dtype).view(torch.int16)), name


@triton.jit
def _store_rows_kernel(x_ptr, y_ptr, n_rows, ROWS: tl.constexpr, UPCAST: tl.constexpr):
    offs_r = tl.arange(0, ROWS)
    x = tl.load(x_ptr + offs_r[:, None] * 16 + tl.arange(0, 16)[None, :])
    kernels._store_rows(y_ptr, offs_r, n_rows, x, 16, UPCAST)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_store_rounds_to_nearest_even_like_torch(dtype) -> None:
    """The kernels' one store of an fp32 accumulator: ties to even, overflow to inf, NaN
    kept, otherwise the same bits as torch's cast (under the interpreter too, whose own fp32 -> bf16
    cast truncates); rows past n_rows untouched."""
    need_triton()
    dev = "cuda" if ON_GPU else "cpu"
    special = [
        0x3F808000, 0x3F818000, 0xBF818000, 0x3F808001, 0x3F807FFF,  # bf16 ties and near
        0x3F801000, 0x3F803000,  # fp16 ties (13 dropped bits): even down, odd up
        0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0x7FC00000, 0x00000001, 0x80000000,
    ]  # fmt: skip
    bits = torch.tensor(special, dtype=torch.int64).to(torch.int32)
    x = torch.randn(16, 16, generator=torch.Generator().manual_seed(3))
    x.view(-1)[: len(special)] = bits.view(torch.float32)
    y = torch.full((16, 16), float("nan"), dtype=dtype)
    x, y = x.to(dev), y.to(dev)
    _store_rows_kernel[(1,)](x, y, 13, ROWS=16, UPCAST=not ON_GPU)
    got, want = y[:13], x[:13].to(dtype)
    nan = want.isnan()  # NaN's payload bits are not part of the rule (torch's differ by device)
    assert torch.equal(got.isnan(), nan) and nan.sum() == 1
    assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))
    assert y[13:].isnan().all()
