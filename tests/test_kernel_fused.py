"""The fused ops of real models: swiglu/geglu, add_rms_norm, linear_cross_entropy.

Raw Triton kernels (GPU, or the interpreter on tiny shapes) and the torch ops (autograd,
opcheck, compile) against float64 torch references; the JAX functions and their grads.
"""

from __future__ import annotations

import itertools
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from _kernel_testing import (  # noqa: E402
    DEVICE,
    ON_GPU,
    assert_close,
    expected_impl,
    expected_jax_impl,
    need_triton,
    order_tol,
)

import greta_core.torch  # noqa: E402, F401
from greta_core import observe, raw  # noqa: E402
from greta_core.ops import linear_cross_entropy as lce_ops  # noqa: E402

# GRETA's kernels in training too (the tables hand small norm/softmax training calls to torch).
pytestmark = pytest.mark.usefixtures("greta_training")

F = torch.nn.functional
GLU_REFS = {
    "swiglu": F.silu,
    "geglu": lambda g: F.gelu(g, approximate="tanh"),
}


def _grads(out, inputs, dy):
    return torch.autograd.grad(out, inputs, dy)


# --- swiglu / geglu -----------------------------------------------------------------------

GLU_SHAPES = [(3, 37), (2, 5, 16)] + ([(4096, 14336)] if ON_GPU else [])


@pytest.mark.parametrize("op", ["swiglu", "geglu"])
@pytest.mark.parametrize("shape", GLU_SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_raw_glu_fwd_bwd(op, shape, dtype) -> None:
    need_triton()
    torch.manual_seed(0)
    gate = torch.randn(shape, device=DEVICE, dtype=dtype)
    up = torch.randn(shape, device=DEVICE, dtype=dtype)
    dy = torch.randn(shape, device=DEVICE, dtype=dtype)
    gd, ud = (t.double().requires_grad_() for t in (gate, up))
    ref = GLU_REFS[op](gd) * ud
    rg, ru = _grads(ref, (gd, ud), dy.double())
    y = getattr(raw, op)(gate, up)
    dg, du = getattr(raw, f"{op}_bwd")(dy, gate, up)
    assert observe.last_implementation(f"{op}_bwd") == expected_impl()
    assert_close(y, ref.detach(), dtype)
    assert_close(dg, rg, dtype, scale=2.0)
    assert_close(du, ru, dtype)


@pytest.mark.parametrize("op", ["swiglu", "geglu"])
def test_torch_glu_autograd_and_gradcheck(op) -> None:
    torch.manual_seed(1)
    gate = torch.randn(4, 24, device=DEVICE, requires_grad=True)
    up = torch.randn(4, 24, device=DEVICE, requires_grad=True)
    dy = torch.randn(4, 24, device=DEVICE)
    fn = getattr(torch.ops.greta, op)
    gd, ud = (t.detach().double().requires_grad_() for t in (gate, up))
    ref = GLU_REFS[op](gd) * ud
    got = _grads(fn(gate, up), (gate, up), dy)
    want = _grads(ref, (gd, ud), dy.double())
    for g, r in zip(got, want, strict=True):
        assert_close(g, r, torch.float32, scale=2.0)
    g64 = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    u64 = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(fn, (g64, u64))


def test_glu_rejects_bad_input() -> None:
    a = torch.randn(3, 4, device=DEVICE)
    with pytest.raises(raw.GretaInputError, match="shapes must match"):
        torch.ops.greta.swiglu(a, torch.randn(3, 5, device=DEVICE))
    with pytest.raises(raw.GretaInputError, match="argument 'up' has dtype"):
        torch.ops.greta.geglu(a, a.double())


# --- add_rms_norm -------------------------------------------------------------------------

ARN_SHAPES = [(3, 37), (2, 3, 64)] + ([(4096, 4096), (8, 20000)] if ON_GPU else [(3, 8229)])


def _arn_ref(x, r, w, eps):
    s = x + r
    return s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * w, s


@pytest.mark.parametrize("shape", ARN_SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_raw_add_rms_norm_fwd_bwd(shape, dtype) -> None:
    need_triton()
    torch.manual_seed(2)
    x, r, dy, ds = (torch.randn(shape, device=DEVICE, dtype=dtype) for _ in range(4))
    w = torch.randn(shape[-1], device=DEVICE, dtype=dtype)
    y, s, rstd = raw.add_rms_norm_fwd(x, r, w, 1e-6)
    # The norm is of s as stored in x's dtype: the reference starts from that s.
    assert_close(s, x.double() + r.double(), dtype)
    sd, wd = s.double().requires_grad_(), w.double().requires_grad_()
    ref = sd * torch.rsqrt(sd.pow(2).mean(-1, keepdim=True) + 1e-6) * wd
    assert_close(y, ref.detach(), dtype)
    dx, dw = raw.add_rms_norm_bwd(dy, ds, s, w, rstd)
    rs, rw = _grads(ref, (sd, wd), dy.double())
    assert observe.last_implementation("add_rms_norm_bwd") == expected_impl()
    assert_close(dx, rs + ds.double(), dtype, scale=2.0)
    assert_close(dw, rw, dtype, scale=4.0 * math.sqrt(math.prod(shape[:-1])))


def test_torch_add_rms_norm_autograd_matches_float64() -> None:
    torch.manual_seed(3)
    shape = (2, 3, 40)
    x, r = (torch.randn(shape, device=DEVICE, requires_grad=True) for _ in range(2))
    w = torch.randn(40, device=DEVICE, requires_grad=True)
    dy, ds = torch.randn(shape, device=DEVICE), torch.randn(shape, device=DEVICE)
    y, s = torch.ops.greta.add_rms_norm(x, r, w, 1e-6)
    got = torch.autograd.grad((y, s), (x, r, w), (dy, ds))
    xd, rd, wd = (t.detach().double().requires_grad_() for t in (x, r, w))
    ry, rs = _arn_ref(xd, rd, wd, 1e-6)
    want = torch.autograd.grad((ry, rs), (xd, rd, wd), (dy.double(), ds.double()))
    assert_close(y.detach(), ry.detach(), torch.float32)
    for g, ref in zip(got, want, strict=True):
        assert_close(g, ref, torch.float32, scale=4.0)
    args = [torch.randn(3, 6, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    w64 = torch.randn(6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, b, w: torch.ops.greta.add_rms_norm(a, b, w, 1e-6), (*args, w64)
    )


def test_add_rms_norm_no_grad_and_strided_inputs() -> None:
    """The no-grad call (on a GPU: the plan launched without the custom-op dispatch) and a
    repeated call (the cached signature) agree; leading dims that need a copy work."""
    need_triton()
    torch.manual_seed(11)
    x = torch.randn(5, 3, 40, device=DEVICE).transpose(0, 1)  # not flattenable as a view
    r = torch.randn(3, 5, 40, device=DEVICE)
    w = torch.randn(40, device=DEVICE)
    with torch.no_grad():
        y, s = torch.ops.greta.add_rms_norm(x, r, w, 1e-6)
    assert observe.last_implementation("add_rms_norm") == expected_impl()
    ry, rs = _arn_ref(x.double(), r.double(), w.double(), 1e-6)
    assert_close(s, rs, torch.float32)
    assert_close(y, ry, torch.float32)
    for _ in range(2):
        y2, s2, _ = raw.add_rms_norm_fwd(x, r, w, 1e-6)
        assert torch.equal(y, y2) and torch.equal(s, s2)


def test_add_rms_norm_rejects_bad_input() -> None:
    x = torch.randn(3, 8, device=DEVICE)
    with pytest.raises(raw.GretaInputError, match="shapes must match"):
        torch.ops.greta.add_rms_norm(x, torch.randn(3, 9, device=DEVICE), torch.ones(8), 1e-6)
    with pytest.raises(raw.GretaInputError, match="argument 'weight' has shape"):
        torch.ops.greta.add_rms_norm(x, x, torch.ones(5, device=DEVICE), 1e-6)


# --- linear_cross_entropy -----------------------------------------------------------------


def _lce_case(n, h, v, dtype, seed=4):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=gen).to(DEVICE, dtype)
    weight = (torch.randn(v, h, generator=gen) / math.sqrt(h)).to(DEVICE, dtype)
    target = torch.randint(0, v, (n,), generator=gen).to(DEVICE)
    target[::5] = -100
    return hidden, weight, target


def _lce_ref(hidden, weight, target, reduction):
    hd, wd = hidden.double().requires_grad_(), weight.double().requires_grad_()
    loss = F.cross_entropy(hd @ wd.t(), target, ignore_index=-100, reduction=reduction)
    return loss, hd, wd


def _lce_mean_ref_grads(hidden, weight, target, rows: int = 1024):
    """float64 mean loss and its gradients by autograd, `rows` tokens at a time: the GPU
    case's whole float64 logits (8192 x 128256) and their autograd copies take about 34 GB
    per test, and the suite's workers share one GPU."""
    wd = weight.double().requires_grad_()
    n_valid = (target != -100).sum().clamp(min=1)
    loss = torch.zeros((), dtype=torch.float64, device=hidden.device)
    dh, dw = torch.empty_like(hidden, dtype=torch.float64), torch.zeros_like(wd)
    for start in range(0, hidden.shape[0], rows):
        hb = hidden[start : start + rows].double().requires_grad_()
        tb = target[start : start + rows]
        part = F.cross_entropy(hb @ wd.t(), tb, ignore_index=-100, reduction="sum") / n_valid
        gh, gw = torch.autograd.grad(part, (hb, wd))
        loss += part.detach()
        dh[start : start + rows] = gh
        dw += gw
    return loss, dh, dw


def test_chunk_schedule_covers_rows_in_power_of_two_chunks() -> None:
    assert lce_ops.chunk_rows(8192, 128256, 2048) == 256
    assert lce_ops.chunk_rows(10, 40, 16) == 4
    spans = lce_ops.chunks(1000, 128256, 2048)
    assert spans[0] == (0, 16) and spans[-1][1] == 1000
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))


LCE_CASES = [(13, 16, 40), (9, 32, 200)] + ([(8192, 2048, 128256)] if ON_GPU else [])


def _assert_rel(got, ref, tol: float) -> None:
    """max |got - ref| relative to max |ref| (gradients of a mean are tiny: no floor of 1)."""
    assert not torch.isnan(got).any()
    err = (got.double() - ref.double()).abs().max().item()
    mag = ref.double().abs().max().item()
    assert err <= tol * mag, f"max abs err {err:.3e} vs magnitude {mag:.3e}"


@pytest.mark.parametrize(("n", "h", "v"), LCE_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_raw_linear_cross_entropy_with_grads(n, h, v, dtype) -> None:
    need_triton()
    hidden, weight, target = _lce_case(n, h, v, dtype)
    loss, dh, dw = raw.linear_cross_entropy_fwd(hidden, weight, target, -100, "mean", True)
    assert observe.last_implementation("linear_cross_entropy") == expected_impl()
    # Several chunks in the CPU cases too: the chunked reference is exercised where it runs.
    ref, rh, rw = _lce_mean_ref_grads(hidden, weight, target, rows=min(1024, max(1, n // 3)))
    assert loss.dtype == torch.float32
    fp32 = dtype == torch.float32
    assert abs(loss.item() - ref.item()) <= (2e-5 if fp32 else 1e-2) * ref.item()
    _assert_rel(dh, rh, 1e-4 if fp32 else 3e-2)
    # bf16: the weight gradient is accumulated chunk by chunk in bf16 (as Liger does).
    _assert_rel(dw, rw, 1e-4 if fp32 else 6e-2)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_torch_linear_cross_entropy_autograd(reduction) -> None:
    hidden, weight, target = _lce_case(11, 16, 48, torch.float32, seed=5)
    hidden.requires_grad_()
    weight.requires_grad_()
    loss = torch.ops.greta.linear_cross_entropy(hidden, weight, target, -100, reduction)
    ref, hd, wd = _lce_ref(hidden.detach(), weight.detach(), target, reduction)
    go = torch.rand(loss.shape, device=DEVICE) + 0.5  # an upstream gradient != 1
    got = torch.autograd.grad(loss, (hidden, weight), go)
    want = torch.autograd.grad(ref, (hd, wd), go.double())
    assert_close(loss.detach(), ref.detach(), torch.float32)
    for g, r in zip(got, want, strict=True):
        assert_close(g, r, torch.float32, scale=2.0)


def test_linear_cross_entropy_all_ignored_is_zero_with_zero_grads() -> None:
    hidden, weight, _ = _lce_case(6, 16, 40, torch.float32)
    target = torch.full((6,), -100, device=DEVICE)
    hidden.requires_grad_()
    loss = torch.ops.greta.linear_cross_entropy(hidden, weight, target)
    (dh,) = torch.autograd.grad(loss, (hidden,))
    assert loss.item() == 0.0
    assert dh.abs().max().item() == 0.0


def test_linear_cross_entropy_gradcheck_reference() -> None:
    hidden, weight, target = _lce_case(5, 4, 7, torch.float64)
    for reduction in ("mean", "none"):
        assert torch.autograd.gradcheck(
            lambda h, w, red=reduction: torch.ops.greta.linear_cross_entropy(
                h, w, target, -100, red
            ),
            (hidden.requires_grad_(), weight.requires_grad_()),
        )


def test_linear_cross_entropy_rejects_bad_input() -> None:
    hidden, weight, target = _lce_case(6, 16, 40, torch.float32)
    with pytest.raises(raw.GretaInputError, match="argument 'weight' has shape"):
        torch.ops.greta.linear_cross_entropy(hidden, weight[:, :8], target)
    with pytest.raises(raw.GretaInputError, match="one per row"):
        torch.ops.greta.linear_cross_entropy(hidden, weight, target[:3])
    with pytest.raises(raw.GretaInputError, match="argument 'target' has dtype"):
        torch.ops.greta.linear_cross_entropy(hidden, weight, target.int())
    with pytest.raises(raw.GretaInputError, match="reduction"):
        torch.ops.greta.linear_cross_entropy(hidden, weight, target, -100, "avg")


# --- torch.library contracts and torch.compile ---------------------------------------------


def test_torch_opcheck_glu() -> None:
    torch.manual_seed(6)
    ops = torch.ops.greta
    g = torch.randn(3, 16, device=DEVICE, requires_grad=True)
    u = torch.randn(3, 16, device=DEVICE, requires_grad=True)
    for op in ("swiglu", "geglu"):
        torch.library.opcheck(getattr(ops, op).default, (g, u))
        torch.library.opcheck(getattr(ops, f"{op}_fwd").default, (g, u))
        dy = torch.randn(3, 16, device=DEVICE)
        torch.library.opcheck(getattr(ops, f"{op}_bwd").default, (dy, g.detach(), u.detach()))


def test_torch_opcheck_add_rms_norm() -> None:
    torch.manual_seed(6)
    ops = torch.ops.greta
    x = torch.randn(2, 3, 24, device=DEVICE, requires_grad=True)
    r = torch.randn(2, 3, 24, device=DEVICE, requires_grad=True)
    w = torch.randn(24, device=DEVICE, requires_grad=True)
    torch.library.opcheck(ops.add_rms_norm_fwd.default, (x, r, w, 1e-6))
    torch.library.opcheck(ops.add_rms_norm.default, (x, r, w, 1e-6))
    _, s, rstd = ops.add_rms_norm_fwd(x.detach(), r.detach(), w.detach(), 1e-6)
    dy, ds = torch.randn_like(s), torch.randn_like(s)
    torch.library.opcheck(ops.add_rms_norm_bwd.default, (dy, ds, s, w.detach(), rstd))


def test_torch_opcheck_linear_cross_entropy() -> None:
    ops = torch.ops.greta
    hidden, weight, target = _lce_case(7, 16, 40, torch.float32)
    hg, wg = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    for reduction, with_grad in (("mean", True), ("sum", False), ("none", False)):
        args = (hg, wg, target, -100, reduction, with_grad)
        torch.library.opcheck(ops.linear_cross_entropy_fwd.default, args)
    torch.library.opcheck(ops.linear_cross_entropy.default, (hg, wg, target, -100, "mean"))
    scale = torch.rand(7, device=DEVICE)
    torch.library.opcheck(
        ops.linear_cross_entropy_bwd.default, (hidden, weight, target, scale, -100)
    )


def test_torch_compile_fullgraph_fused_ops() -> None:
    torch._dynamo.reset()

    def f(x, r, w, wg, wo, target):
        h, s = torch.ops.greta.add_rms_norm(x, r, w, 1e-6)
        gate, up = (h @ wg).chunk(2, dim=-1)
        return torch.ops.greta.linear_cross_entropy(
            s + torch.ops.greta.swiglu(gate, up), wo, target
        )

    x = torch.randn(6, 16, device=DEVICE, requires_grad=True)
    r = torch.randn(6, 16, device=DEVICE)
    w = torch.randn(16, device=DEVICE, requires_grad=True)
    wg = torch.randn(16, 32, device=DEVICE, requires_grad=True)
    wo = torch.randn(24, 16, device=DEVICE, requires_grad=True)
    target = torch.randint(0, 24, (6,), device=DEVICE)
    params = (x, w, wg, wo)
    out = torch.compile(f, fullgraph=True, backend="aot_eager")(x, r, w, wg, wo, target)
    got = torch.autograd.grad(out, params)
    ref = f(x, r, w, wg, wo, target)
    want = torch.autograd.grad(ref, params)
    # Compiled and eager differ in evaluation order (the interpreter on CPU); the longest
    # accumulation chain: rms_norm (16) -> gate/up matmul (16) -> vocab matmul (16) ->
    # logsumexp (24) -> mean (6), and back again through the same and the wg/wo grads (32, 6).
    terms = 2 * (16 + 16 + 16 + 24 + 6) + 32 + 6
    torch.testing.assert_close(out, ref, **order_tol(torch.float32, terms, ref))
    for g, w_ in zip(got, want, strict=True):
        torch.testing.assert_close(g, w_, **order_tol(torch.float32, terms, w_))


# --- JAX ----------------------------------------------------------------------------------


def _jax():
    jax = pytest.importorskip("jax")
    np = pytest.importorskip("numpy")
    from greta_core import jax as gj

    return jax, jax.numpy, np, gj


def _torch_grads(fn, *arrays):
    ts = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays]
    out = fn(*ts)
    return out.detach().numpy(), [g.numpy() for g in torch.autograd.grad(out, ts)]


def _close(a, b, tol=1e-4):
    import numpy as np

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.abs(a - b).max() <= tol * max(1.0, np.abs(b).max())


def test_jax_glu_and_grads() -> None:
    jax, jnp, np, gj = _jax()
    rng = np.random.default_rng(8)
    g, u = (rng.standard_normal((3, 8)).astype(np.float32) for _ in range(2))
    for name, act in GLU_REFS.items():
        fn = getattr(gj, name)
        val, grads = jax.value_and_grad(lambda a, b, fn=fn: jnp.sum(fn(a, b) ** 2), (0, 1))(
            jnp.asarray(g), jnp.asarray(u)
        )
        ref, rgrads = _torch_grads(lambda a, b, act=act: ((act(a) * b) ** 2).sum(), g, u)
        _close(val, ref)
        for x, y in zip(grads, rgrads, strict=True):
            _close(x, y)
    assert observe.last_implementation("geglu_bwd") == expected_jax_impl()


def test_jax_add_rms_norm_and_grads() -> None:
    jax, jnp, np, gj = _jax()
    rng = np.random.default_rng(9)
    x, r = (rng.standard_normal((4, 16)).astype(np.float32) for _ in range(2))
    w = rng.standard_normal(16).astype(np.float32)

    def arn(x, r, w):
        y, s = gj.add_rms_norm(x, r, w, 1e-6)
        return jnp.sum(y * y) + jnp.sum(s**3)

    def arn_ref(x, r, w):
        y, s = _arn_ref(x, r, w, 1e-6)
        return (y * y).sum() + (s**3).sum()

    val, grads = jax.value_and_grad(arn, (0, 1, 2))(*map(jnp.asarray, (x, r, w)))
    ref, rgrads = _torch_grads(arn_ref, x, r, w)
    _close(val, ref)
    for a, b in zip(grads, rgrads, strict=True):
        _close(a, b, 1e-3)


def test_jax_linear_cross_entropy_and_grads() -> None:
    jax, jnp, np, gj = _jax()
    rng = np.random.default_rng(10)
    h = rng.standard_normal((10, 16)).astype(np.float32)
    wo = rng.standard_normal((40, 16)).astype(np.float32) / 4
    t = rng.integers(0, 40, 10)
    t[3] = -100
    weights = np.arange(1, 11, dtype=np.float32)
    for reduction in ("mean", "none"):

        def lce(h, wo, reduction=reduction):
            loss = gj.linear_cross_entropy(h, wo, jnp.asarray(t), -100, reduction)
            return jnp.sum(loss * weights) if reduction == "none" else loss

        def lce_ref(h, wo, reduction=reduction):
            loss = F.cross_entropy(h @ wo.t(), torch.tensor(t), reduction=reduction)
            return (loss * torch.tensor(weights)).sum() if reduction == "none" else loss

        val, grads = jax.value_and_grad(lce, (0, 1))(jnp.asarray(h), jnp.asarray(wo))
        ref, rgrads = _torch_grads(lce_ref, h, wo)
        _close(val, ref)
        for a, b in zip(grads, rgrads, strict=True):
            _close(a, b)
    assert observe.last_implementation("linear_cross_entropy") == expected_jax_impl()
    with pytest.raises(raw.GretaInputError, match="target"):
        gj.linear_cross_entropy(jnp.asarray(h), jnp.asarray(wo), jnp.zeros(3, jnp.int32))
