"""softmax over the last dim: raw Triton kernels, torch op, JAX."""

from __future__ import annotations

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
    poisoned,
)

import greta_core.torch  # noqa: E402, F401
from greta_core import observe, raw  # noqa: E402
from greta_core.ops import softmax as sm_ops  # noqa: E402

# GRETA's kernels in training too (the tables hand small norm/softmax training calls to torch).
pytestmark = pytest.mark.usefixtures("greta_training")

SHAPES = [(3, 37), (2, 3, 64), (3, 130)] + ([(8192, 8192), (4, 32768)] if ON_GPU else [])
# Longer than the one-pass limit of the table in use: the online (looped) variant.
LOOPED = (3, 16411) if not ON_GPU else (4, 70000)


@pytest.mark.parametrize("shape", [*SHAPES, LOOPED])
@pytest.mark.parametrize("dtype", DTYPES)
def test_raw_softmax_fwd(shape, dtype) -> None:
    need_triton()
    x = (torch.randn(shape, device=DEVICE) * 8).to(dtype)  # wide range: tests max-subtraction
    x2 = x.reshape(-1, shape[-1])
    y = poisoned(x2.shape, dtype)
    sm_ops.launch_fwd(x2, y, sm_ops.validate(x))
    assert_close(y.reshape(shape), torch.softmax(x.double(), -1), dtype)
    assert observe.last_implementation("softmax") == expected_impl()


def test_raw_softmax_extreme_values() -> None:
    need_triton()
    x = torch.tensor([[1e4, 0.0, -1e4], [-float("inf"), 0.0, 1.0]], device=DEVICE)
    y = raw.softmax(x)
    assert_close(y, torch.softmax(x.double(), -1), torch.float32)


@pytest.mark.parametrize("shape", [(3, 37), (2, 130), LOOPED])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_raw_softmax_bwd(shape, dtype) -> None:
    need_triton()
    x = torch.randn(shape, device=DEVICE, dtype=dtype)
    dy = torch.randn(shape, device=DEVICE, dtype=dtype)
    y = raw.softmax(x)
    xd = x.double().requires_grad_()
    (gx,) = torch.autograd.grad(torch.softmax(xd, -1), xd, dy.double())
    dx = poisoned(shape, dtype)
    sm_ops.launch_bwd(dy, y, dx, sm_ops.validate_bwd(dy, y))
    assert_close(dx, gx, dtype, scale=2.0)


def test_softmax_rejects_bad_input() -> None:
    with pytest.raises(raw.GretaInputError, match="argument 'x' has dtype"):
        raw.softmax(torch.ones(3, 4, dtype=torch.int64))
    with pytest.raises(raw.GretaInputError, match="argument 'x' needs a non-empty last dim"):
        raw.softmax(torch.ones(3, 0))
    with pytest.raises(raw.GretaInputError, match="argument 'dy' has dtype"):
        raw.softmax_bwd(torch.ones(3, 4, dtype=torch.float16), torch.ones(3, 4))
    with pytest.raises(raw.GretaInputError, match="argument 'x' must be contiguous"):
        torch.ops.greta.softmax(torch.ones(4, 3).t())


def test_torch_softmax_gradcheck_opcheck_autograd() -> None:
    xd = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(torch.ops.greta.softmax, (xd,))
    shape = (2, 3, 37) if not ON_GPU else (512, 8192)
    x = torch.randn(shape, device=DEVICE, requires_grad=True)
    y = torch.ops.greta.softmax(x)
    dy = torch.randn_like(x)
    (gx,) = torch.autograd.grad(y, x, dy)
    x64 = x.detach().double().requires_grad_()
    (rx,) = torch.autograd.grad(torch.softmax(x64, -1), x64, dy.double())
    assert_close(y.detach(), torch.softmax(x64.detach(), -1), torch.float32)
    assert_close(gx, rx, torch.float32, scale=2.0)
    small = torch.randn(3, 37, device=DEVICE, requires_grad=True)
    torch.library.opcheck(torch.ops.greta.softmax.default, (small,))
    torch.library.opcheck(torch.ops.greta.softmax_fwd.default, (small,))  # the front's
    yy = torch.ops.greta.softmax(small.detach())
    torch.library.opcheck(torch.ops.greta.softmax_bwd.default, (torch.randn_like(yy), yy))


def test_jax_softmax_and_grad() -> None:
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    import numpy as np

    from greta_core import jax as gj

    rng = np.random.default_rng(0)
    x = (rng.standard_normal((4, 130)) * 5).astype(np.float32)
    xd = x.astype(np.float64)
    ref = np.exp(xd - xd.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    assert np.abs(np.asarray(gj.softmax(jnp.asarray(x))) - ref).max() < 1e-6
    dy = jnp.asarray(rng.standard_normal(x.shape).astype(np.float32))
    got = jax.grad(lambda a: jnp.sum(gj.softmax(a) * dy))(jnp.asarray(x))
    want = jax.grad(lambda a: jnp.sum(jax.nn.softmax(a, -1) * dy))(jnp.asarray(x))
    assert np.abs(np.asarray(got) - np.asarray(want)).max() < 1e-5
    assert observe.last_implementation("softmax_bwd") == expected_jax_impl()
