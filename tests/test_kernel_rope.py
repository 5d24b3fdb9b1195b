"""RoPE (rotate-half, [batch, seq, heads, head_dim]): raw kernels, torch ops, JAX."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from _kernel_testing import (  # noqa: E402
    DEVICE,
    DTYPES,
    ON_GPU,
    assert_close,
    expected_impl,
    graph_recorder,
    need_triton,
)

import greta_core.torch  # noqa: E402, F401
from greta_core import observe, raw  # noqa: E402

# (batch, seq, heads, head_dim): odd head counts, non-power-of-two head_dim/2.
SHAPES = [(2, 3, 3, 16), (1, 5, 2, 80)] + ([(4, 2048, 32, 128)] if ON_GPU else [])


def _ref(x, cos, sin, inverse=False):
    """float64 rotate-half; cos/sin [S, d/2] or [B, S, d/2]."""
    c, s = cos.double().unsqueeze(-2), sin.double().unsqueeze(-2)
    if c.dim() == 3:
        c, s = c[None], s[None]
    s = -s if inverse else s
    h = x.shape[-1] // 2
    x1, x2 = x.double()[..., :h], x.double()[..., h:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)


def _angles64(pos, theta, d):
    i = torch.arange(d // 2, dtype=torch.float64, device=pos.device)
    return pos.double()[..., None] * theta ** (-2 * i / d)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batched_table", [False, True])
def test_raw_rope(shape, dtype, batched_table) -> None:
    need_triton()
    b, s, h, d = shape
    # Strided input: a view of a wider tensor (heads interleaved with padding).
    base = torch.randn(b, s, h + 1, d, device=DEVICE, dtype=dtype)
    x = base[:, :, 1:, :]
    ang = torch.rand((b, s, d // 2) if batched_table else (s, d // 2), device=DEVICE) * 6
    cos, sin = ang.cos(), ang.sin()
    out = raw.rope(x, cos, sin)
    assert out.is_contiguous()
    assert_close(out, _ref(x, cos, sin), dtype)
    back = raw.rope(out, cos, sin, inverse=True)
    assert_close(back, x.double(), dtype, scale=2.0)
    assert observe.last_implementation("rope") == expected_impl()


@pytest.mark.parametrize("pos_shape", ["seq", "batch_seq"])
@pytest.mark.parametrize("pos_dtype", [torch.int32, torch.int64])
def test_raw_rope_positions(pos_shape, pos_dtype) -> None:
    need_triton()
    b, s, h, d = SHAPES[1] if not ON_GPU else SHAPES[-1]
    x = torch.randn(b, s, h, d, device=DEVICE)
    if pos_shape == "seq":
        pos = torch.arange(s, device=DEVICE, dtype=pos_dtype) + 3
    else:
        pos = torch.randint(0, 64, (b, s), device=DEVICE, dtype=pos_dtype)
    ang = _angles64(pos, 10000.0, d)
    out = raw.rope_positions(x, pos, 10000.0)
    # The kernel forms angle = pos * inv_freq in fp32 (as every fp32 RoPE does): its
    # rounding, about ulp(max angle), bounds the error on top of the fp32 math tolerance.
    angle_ulp = float(ang.abs().max()) * 2.0**-23
    scale = 5.0 + 4 * angle_ulp / 2e-5
    assert_close(out, _ref(x, ang.cos(), ang.sin()), torch.float32, scale=scale)
    assert observe.last_implementation("rope_positions") == expected_impl()


def test_rope_rejects_bad_input() -> None:
    x = torch.randn(1, 4, 2, 8)
    cs = torch.randn(4, 4)
    with pytest.raises(raw.GretaInputError, match="argument 'x' has head_dim 7"):
        raw.rope(torch.randn(1, 4, 2, 7), cs, cs)
    with pytest.raises(raw.GretaInputError, match="argument 'x' has 3 dimensions"):
        raw.rope(torch.randn(4, 2, 8), cs, cs)
    with pytest.raises(raw.GretaInputError, match="argument 'cos' has shape"):
        raw.rope(x, torch.randn(5, 4), cs)
    with pytest.raises(raw.GretaInputError, match="argument 'sin' has dtype"):
        raw.rope(x, cs, cs.half())
    with pytest.raises(raw.GretaInputError, match="argument 'positions' has dtype"):
        raw.rope_positions(x, torch.arange(4.0))
    with pytest.raises(raw.GretaInputError, match="argument 'theta'"):
        raw.rope_positions(x, torch.arange(4), -1.0)


def test_torch_rope_ops_autograd_opcheck() -> None:
    b, s, h, d = 2, 3, 2, 8
    ang = torch.rand(s, d // 2, dtype=torch.float64) * 3
    xd = torch.randn(b, s, h, d, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: torch.ops.greta.rope(x, ang.cos(), ang.sin()), (xd,))
    pos = torch.arange(s)
    assert torch.autograd.gradcheck(lambda x: torch.ops.greta.rope_positions(x, pos, 500.0), (xd,))
    # fp32 through the Triton path (interpreter on CPU) vs float64 autograd.
    x = torch.randn(b, s, h, d, device=DEVICE, requires_grad=True)
    cos, sin = ang.cos().float().to(DEVICE), ang.sin().float().to(DEVICE)
    dy = torch.randn_like(x)
    (gx,) = torch.autograd.grad(torch.ops.greta.rope(x, cos, sin), x, dy)
    x64 = x.detach().double().requires_grad_()
    (rx,) = torch.autograd.grad(_ref(x64, cos, sin), x64, dy.double())
    assert_close(gx, rx, torch.float32)
    torch.library.opcheck(torch.ops.greta.rope.default, (x, cos, sin))
    torch.library.opcheck(torch.ops.greta.rope.default, (x, cos, sin, True))
    posd = pos.to(DEVICE)
    torch.library.opcheck(torch.ops.greta.rope_positions.default, (x, posd, 10000.0))


def test_torch_compile_graphs_hold_the_rope_kernel_op() -> None:
    """Dynamo records greta::rope; AOTAutograd decomposes it into the triton_op
    greta::rope_fwd, forward and backward (the inverse rotation): on a GPU both graphs
    launch the Triton kernel (on the CPU the triton_op traces its torch reference)."""
    graphs, backend = graph_recorder()

    b, s, h, d = 2, 3, 2, 8
    ang = torch.rand(s, d // 2, device=DEVICE) * 3
    cos, sin = ang.cos(), ang.sin()

    def f(x):  # type: ignore[no-untyped-def]
        return torch.ops.greta.rope(x, cos, sin) * 2

    x = torch.randn(b, s, h, d, device=DEVICE, requires_grad=True)
    dy = torch.randn_like(x)
    torch._dynamo.reset()
    y = torch.compile(f, fullgraph=True, backend=backend)(x)
    (gx,) = torch.autograd.grad(y, x, dy)
    torch._dynamo.reset()
    dynamo, forward, backward = graphs
    assert "greta.rope" in dynamo, sorted(dynamo)
    if ON_GPU:
        for graph in (forward, backward):
            assert any("triton_kernel_wrapper" in t for t in graph), sorted(graph)
    assert_close(y, 2 * _ref(x.detach(), cos, sin), torch.float32)
    assert_close(gx, _ref(2 * dy, cos, sin, inverse=True), torch.float32)


def test_jax_rope_and_grad() -> None:
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    import numpy as np

    from greta_core import jax as gj

    rng = np.random.default_rng(0)
    b, s, h, d = 2, 5, 3, 12
    x = rng.standard_normal((b, s, h, d)).astype(np.float32)
    ang = (rng.random((s, d // 2)) * 4).astype(np.float32)
    want = _ref(torch.from_numpy(x), torch.from_numpy(np.cos(ang)), torch.from_numpy(np.sin(ang)))
    got = gj.rope(jnp.asarray(x), jnp.cos(ang), jnp.sin(ang))
    assert np.abs(np.asarray(got) - want.numpy()).max() < 1e-5
    pos = jnp.arange(s, dtype=jnp.int32)
    theta = 10000.0
    ang64 = _angles64(torch.arange(s), theta, d)
    want = _ref(torch.from_numpy(x), ang64.cos(), ang64.sin()).numpy()
    got = gj.rope_positions(jnp.asarray(x), pos, theta)
    assert np.abs(np.asarray(got) - want).max() < 1e-5
    # rotation is orthogonal: the gradient of <rope(x), dy> is rope(dy, inverse=True).
    dy = jnp.asarray(rng.standard_normal(x.shape).astype(np.float32))
    g = jax.grad(lambda a: jnp.sum(gj.rope_positions(a, pos, theta) * dy))(jnp.asarray(x))
    inv = gj.rope_positions(dy, pos, theta, inverse=True)
    assert np.abs(np.asarray(g) - np.asarray(inv)).max() < 1e-6
    assert math.isclose(float(jnp.sum(g * g)), float(jnp.sum(dy * dy)), rel_tol=1e-4)
    with pytest.raises(raw.GretaInputError, match="argument 'positions' has dtype"):
        gj.rope_positions(jnp.asarray(x), jnp.arange(s, dtype=jnp.float32))
