"""rms_norm and layer_norm: raw Triton kernels, torch ops (autograd, opcheck, compile), JAX."""

from __future__ import annotations

import contextlib

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from _kernel_testing import (  # noqa: E402
    DEVICE,
    DTYPES,
    ON_GPU,
    assert_close,
    expected_impl,
    expected_jax_impl,
    need_triton,
    order_tol,
    poisoned,
)

import greta_core.torch  # noqa: E402, F401
from greta_core import observe, raw  # noqa: E402
from greta_core.ops import _plan  # noqa: E402
from greta_core.ops import layer_norm as ln_ops  # noqa: E402
from greta_core.ops import rms_norm as rms_ops  # noqa: E402
from greta_core.ops.declare import Meta  # noqa: E402

# Ragged row lengths, a multi-dim leading shape, and (interpreter-cheap) a looped row.
# GRETA's kernels in training too (the tables hand small norm/softmax training calls to torch).
pytestmark = pytest.mark.usefixtures("greta_training")

SHAPES = [(3, 37), (2, 3, 64), (3, 130)] + ([(64, 8192), (16, 20000)] if ON_GPU else [])
LOOPED = (3, 8229) if not ON_GPU else (8, 40000)


def _rms_ref(x, w, eps):
    xd = x.double()
    return xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * w.double()


def _ln_ref(x, w, b, eps):
    xd = x.double()
    y = torch.nn.functional.layer_norm(xd, (x.shape[-1],), w.double(), None, eps)
    return y if b is None else y + b.double()


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_raw_rms_norm_fwd(shape, dtype) -> None:
    need_triton()
    x = torch.randn(shape, device=DEVICE, dtype=dtype)
    w = torch.randn(shape[-1], device=DEVICE, dtype=dtype)
    x2 = x.reshape(-1, shape[-1])
    y, rstd = poisoned(x2.shape, dtype), poisoned((x2.shape[0],), torch.float32)
    # The declared plan with its statistics, into poisoned buffers: every element written.
    plan = rms_ops.RMS_NORM.plan(rms_ops.validate(x, w), Meta.of(x2), Meta.of(w), 1e-6, True)
    _plan.run(plan, (x2, w), out=(y, rstd))
    assert_close(y.reshape(shape), _rms_ref(x, w, 1e-6), dtype)
    ref_rstd = torch.rsqrt(x2.double().pow(2).mean(-1) + 1e-6)
    assert_close(rstd, ref_rstd, torch.float32)
    assert observe.last_implementation("rms_norm") == expected_impl()


@pytest.mark.parametrize("shape", [*SHAPES, LOOPED])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_raw_rms_norm_bwd(shape, dtype) -> None:
    need_triton()
    x = torch.randn(shape, device=DEVICE, dtype=dtype)
    w = torch.randn(shape[-1], device=DEVICE, dtype=torch.float32)  # mixed: fp32 weight
    dy = torch.randn(shape, device=DEVICE, dtype=dtype)
    y, rstd = raw.rms_norm_fwd(x, w, 1e-6)
    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    gx, gw = torch.autograd.grad(_rms_ref(xd, wd, 1e-6), (xd, wd), dy.double())
    assert_close(y, _rms_ref(x, w, 1e-6), dtype)
    dx, dw = raw.rms_norm_bwd(dy, x, w, rstd)
    assert dw.dtype == torch.float32 and dx.dtype == dtype
    assert_close(dx, gx, dtype)
    assert_close(dw, gw, dtype, scale=4.0)  # sums over rows
    # Deterministic: fixed-order partial sums give bitwise-equal repeats.
    assert torch.equal(raw.rms_norm_bwd(dy, x, w, rstd)[1], dw)


@pytest.mark.parametrize("shape", [*SHAPES, LOOPED])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("bias", [True, False])
def test_raw_layer_norm_fwd_bwd(shape, dtype, bias) -> None:
    need_triton()
    n = shape[-1]
    x = torch.randn(shape, device=DEVICE, dtype=dtype) * 3 + 1.5  # mean offset: tests centring
    w = torch.randn(n, device=DEVICE, dtype=dtype)
    b = torch.randn(n, device=DEVICE, dtype=dtype) if bias else None
    x2 = x.reshape(-1, n)
    y = poisoned(x2.shape, dtype)
    mean, rstd = (poisoned((x2.shape[0],), torch.float32) for _ in range(2))
    bias = None if b is None else Meta.of(b)
    plan = ln_ops.LAYER_NORM.plan(
        ln_ops.validate(x, w, b), Meta.of(x2), Meta.of(w), bias, 1e-5, True
    )
    _plan.run(plan, (x2, w, b), out=(y, mean, rstd))
    assert_close(y.reshape(shape), _ln_ref(x, w, b, 1e-5), dtype)
    assert_close(mean, x2.double().mean(-1), torch.float32)
    dy = torch.randn(shape, device=DEVICE, dtype=dtype)
    dx, dw, db = raw.layer_norm_bwd(dy, x, w, mean, rstd)
    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    gx, gw = torch.autograd.grad(_ln_ref(xd, wd, None, 1e-5), (xd, wd), dy.double())
    assert_close(dx, gx, dtype, scale=2.0)
    assert_close(dw, gw, dtype, scale=4.0)
    assert_close(db, dy.double().reshape(-1, n).sum(0), dtype, scale=4.0)
    assert observe.last_implementation("layer_norm_bwd") == expected_impl()


def test_raw_rejects_bad_input() -> None:
    x = torch.randn(4, 8)
    with pytest.raises(raw.GretaInputError, match="argument 'weight' has shape"):
        raw.rms_norm(x, torch.randn(7))
    with pytest.raises(raw.GretaInputError, match="argument 'weight' has dtype"):
        raw.rms_norm(x, torch.randn(8, dtype=torch.float64))
    with pytest.raises(raw.GretaInputError, match="argument 'x' has dtype"):
        raw.layer_norm(x.to(torch.int32), torch.randn(8))
    with pytest.raises(raw.GretaInputError, match="argument 'x' must be contiguous in its last"):
        raw.rms_norm(torch.randn(8, 4).t(), torch.randn(8))
    with pytest.raises(raw.GretaInputError, match="argument 'bias' has shape"):
        raw.layer_norm(x, torch.randn(8), torch.randn(3))
    with pytest.raises(raw.GretaInputError, match="argument 'rstd' has 3 elements"):
        raw.rms_norm_bwd(x, x, torch.randn(8), torch.ones(3))


@pytest.mark.gpu
def test_raw_rejects_mixed_devices() -> None:
    with pytest.raises(raw.GretaInputError, match="weight on cpu"):
        raw.rms_norm(torch.randn(4, 8, device="cuda"), torch.randn(8))


def test_torch_ops_gradcheck_reference() -> None:
    """float64 takes the torch reference path: checks the analytic backward formulas."""
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, dtype=torch.float64, requires_grad=True)
    b = torch.randn(6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: torch.ops.greta.rms_norm(x, w, 1e-6), (x, w))
    assert torch.autograd.gradcheck(
        lambda x, w, b: torch.ops.greta.layer_norm(x, w, b, 1e-5), (x, w, b)
    )
    assert torch.autograd.gradcheck(lambda x, w: torch.ops.greta.layer_norm(x, w), (x, w))


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_torch_op_autograd_matches_float64(op) -> None:
    shape = (3, 2, 37) if not ON_GPU else (256, 4096)
    x = torch.randn(shape, device=DEVICE, requires_grad=True)
    w = torch.randn(shape[-1], device=DEVICE, requires_grad=True)
    dy = torch.randn(shape, device=DEVICE)
    xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    if op == "rms_norm":
        y, ref = torch.ops.greta.rms_norm(x, w, 1e-6), _rms_ref(xd, wd, 1e-6)
    else:
        y, ref = torch.ops.greta.layer_norm(x, w, None, 1e-5), _ln_ref(xd, wd, None, 1e-5)
    gx, gw = torch.autograd.grad(y, (x, w), dy)
    rx, rw = torch.autograd.grad(ref, (xd, wd), dy.double())
    assert_close(y.detach(), ref.detach(), torch.float32)
    assert_close(gx, rx, torch.float32, scale=2.0)
    assert_close(gw, rw, torch.float32, scale=4.0)
    assert observe.last_implementation(f"{op}_bwd") == expected_impl()


def test_torch_opcheck() -> None:
    x = torch.randn(3, 2, 37, device=DEVICE)
    w = torch.randn(37, device=DEVICE, requires_grad=True)
    b = torch.randn(37, device=DEVICE, requires_grad=True)
    xg = x.clone().requires_grad_()
    ops = torch.ops.greta
    torch.library.opcheck(ops.rms_norm_fwd.default, (xg, w, 1e-6))
    torch.library.opcheck(ops.rms_norm.default, (xg, w, 1e-6))
    _, rstd = ops.rms_norm_fwd(x, w.detach(), 1e-6)
    torch.library.opcheck(ops.rms_norm_bwd.default, (torch.randn_like(x), x, w.detach(), rstd))
    torch.library.opcheck(ops.layer_norm_fwd.default, (xg, w, b, 1e-5))
    torch.library.opcheck(ops.layer_norm_fwd.default, (xg, w, None, 1e-5))
    torch.library.opcheck(ops.layer_norm.default, (xg, w, b, 1e-5))
    _, mean, rstd = ops.layer_norm_fwd(x, w.detach(), None, 1e-5)
    args = (torch.randn_like(x), x, w.detach(), mean, rstd)
    torch.library.opcheck(ops.layer_norm_bwd.default, args)


def _compile_or_skip(fn, backend: str):
    compiled = torch.compile(fn, fullgraph=True, backend=backend)

    def run(*args):
        try:
            return compiled(*args)
        except Exception as exc:  # no C++ toolchain / inductor unsupported here
            if backend == "inductor" and not ON_GPU and "Compile" in type(exc).__name__:
                pytest.skip(f"inductor cannot compile on this machine: {exc}".splitlines()[0])
            raise

    return run


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph(backend) -> None:
    torch._dynamo.reset()

    def f(x, w, b):
        h = torch.ops.greta.rms_norm(x, w, 1e-6)
        return torch.ops.greta.layer_norm(h * 2, w, b, 1e-5).sum()

    x = torch.randn(4, 64, device=DEVICE, requires_grad=True)
    w = torch.randn(64, device=DEVICE, requires_grad=True)
    b = torch.randn(64, device=DEVICE)
    cpu_inductor = contextlib.nullcontext()
    if backend == "inductor" and not ON_GPU:
        # GRETA's part is its ops in inductor's forward and backward graphs; the C++ that
        # inductor writes around them is its own. Scalar C++ built in this process (no ISA
        # probe builds, no compile workers) took 40% less CPU time here.
        import torch._inductor.config as inductor_config

        cpu_inductor = inductor_config.patch({"cpp.vec_isa_ok": False, "compile_threads": 1})
    with cpu_inductor:  # the backward graph compiles at its first call
        out = _compile_or_skip(f, backend)(x, w, b)
        out.backward()
    x2, w2 = x.detach().requires_grad_(), w.detach().requires_grad_()
    ref = f(x2, w2, b)
    ref.backward()
    # Compiled vs eager: rms_norm (64) -> layer_norm (64, twice: mean, variance) -> sum
    # over 4 x 64, and back through the same.
    terms = 2 * (64 + 2 * 64 + 4 * 64)
    torch.testing.assert_close(out, ref, **order_tol(torch.float32, terms, ref))
    torch.testing.assert_close(x.grad, x2.grad, **order_tol(torch.float32, terms, x2.grad))


def test_jax_norms_and_grads() -> None:
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    np = pytest.importorskip("numpy")
    from greta_core import jax as gj

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 37)).astype(np.float32) + 0.5
    w = rng.standard_normal(37).astype(np.float32)
    b = rng.standard_normal(37).astype(np.float32)
    xd = x.astype(np.float64)
    rms64 = xd / np.sqrt((xd**2).mean(-1, keepdims=True) + 1e-6) * w
    mu = xd.mean(-1, keepdims=True)
    ln64 = (xd - mu) / np.sqrt(((xd - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * w + b
    assert np.abs(np.asarray(gj.rms_norm(jnp.asarray(x), jnp.asarray(w))) - rms64).max() < 1e-4
    got = np.asarray(gj.layer_norm(jnp.asarray(x), jnp.asarray(w), jnp.asarray(b)))
    assert np.abs(got - ln64).max() < 1e-4

    def rms_ref(x, w):
        return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * w

    def ln_ref(x, w, b):
        m = x.mean(-1, keepdims=True)
        return (x - m) * jax.lax.rsqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5) * w + b

    dy = jnp.asarray(rng.standard_normal(x.shape).astype(np.float32))
    for fn, ref, args in (
        (gj.rms_norm, rms_ref, (x, w)),
        (gj.layer_norm, ln_ref, (x, w, b)),
    ):
        args = tuple(jnp.asarray(a) for a in args)
        nums = tuple(range(len(args)))
        got = jax.grad(lambda *a, fn=fn: jnp.sum(fn(*a) * dy), argnums=nums)(*args)
        want = jax.grad(lambda *a, ref=ref: jnp.sum(ref(*a) * dy), argnums=nums)(*args)
        for g, r in zip(got, want, strict=True):
            assert np.abs(np.asarray(g) - np.asarray(r)).max() < 1e-3 * max(1, np.abs(r).max())
    assert observe.last_implementation("layer_norm_bwd") == expected_jax_impl()
    with pytest.raises(raw.GretaInputError, match="argument 'weight' has shape"):
        gj.rms_norm(jnp.asarray(x), jnp.ones(5))


def test_row_plan_memo_follows_a_swapped_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    # `greta tune` swaps configs.lookup to time candidates: a memoized plan must not hide it.
    from greta_core import configs
    from greta_core.ops._rows import row_plan

    shipped = row_plan("rms_norm", "sm_90", 4096)
    assert shipped.one_pass is True
    assert row_plan("rms_norm", "sm_90", 4096) is shipped  # memoized
    real = configs.lookup

    def tuned(op: str, arch: str, features: dict | None = None) -> dict:
        return {**real(op, arch, features), "num_warps": 2, "MAX_BLOCK_N": 1024}

    monkeypatch.setattr(configs, "lookup", tuned)
    swapped = row_plan("rms_norm", "sm_90", 4096)
    assert swapped.options["num_warps"] == 2 and swapped.one_pass is False
    monkeypatch.setattr(configs, "lookup", real)
    assert row_plan("rms_norm", "sm_90", 4096) is shipped


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_col_sum_of_two_in_one_launch_equals_two_sums(out_dtype) -> None:
    """layer_norm's backward sums dweight's and dbias's partials ([2, P, N], one buffer) in
    one col_sum launch (a grid of two in its second dim): bit for bit the two separate sums
    over each half (same kernel, same order), neither half written into the other's output.
    A grid of one writes its sum to both outputs (JAX gives each output parameter a buffer
    of its own; torch passes one twice)."""
    need_triton()
    from greta_core.kernels.col_sum import col_sum_kernel

    p, n, block_p, block_n = 5, 37, 4, 16  # several column programs, a looped, ragged P
    partial = torch.randn(2, p, n, device=DEVICE, dtype=torch.float32)
    grid = (-(-n // block_n),)  # column programs
    pair = [poisoned((n,), out_dtype) for _ in range(2)]
    col_sum_kernel[(*grid, 2)](partial, p, n, *pair, BLOCK_P=block_p, BLOCK_N=block_n)
    alone = [poisoned((n,), out_dtype) for _ in range(2)]
    for half, out in zip(partial, alone, strict=True):
        col_sum_kernel[(*grid, 1)](half, p, n, out, out, BLOCK_P=block_p, BLOCK_N=block_n)
    for got, want, half in zip(pair, alone, partial, strict=True):
        assert torch.equal(got, want)
        assert_close(got, half.double().sum(0), out_dtype, scale=2.0)
    both = [poisoned((n,), out_dtype) for _ in range(2)]
    col_sum_kernel[(*grid, 1)](partial[1], p, n, *both, BLOCK_P=block_p, BLOCK_N=block_n)
    assert torch.equal(both[0], alone[1]) and torch.equal(both[1], alone[1])
