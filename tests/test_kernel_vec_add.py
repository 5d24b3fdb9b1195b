"""vec_add through all three bindings, against a float64 reference."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from _kernel_testing import expected_jax_impl  # noqa: E402

from greta_core import observe, raw  # noqa: E402
from greta_core.arch import interpreter_active  # noqa: E402


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _assert_one_rounding(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """One rounding of the exact sum: within half an ulp (a whole one for the interpreter's
    truncating bf16 store) of it, relative to it."""
    assert ((out.double() - ref).abs() <= torch.finfo(dtype).eps * ref.abs()).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_torch_op_vec_add_every_dtype(dtype: torch.dtype) -> None:
    import greta_core.torch  # noqa: F401

    x = torch.randn(257, device=_device(), dtype=dtype)
    y = torch.randn(257, device=_device(), dtype=dtype)
    _assert_one_rounding(torch.ops.greta.vec_add(x, y), x.double() + y.double(), dtype)


@pytest.mark.parametrize("n", [1, 17, 1000, 4099])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_raw_vec_add_matches_reference(n: int, dtype: torch.dtype) -> None:
    """bf16 gave NaN and ~1e37 through the interpreter (issue 30 item 8)."""
    if _device() == "cpu" and not interpreter_active():
        pytest.skip("raw Triton on CPU needs TRITON_INTERPRET=1")
    x = torch.randn(n, device=_device(), dtype=dtype)
    y = torch.randn(n, device=_device(), dtype=dtype)
    out = torch.full_like(x, float("nan"))  # poison: unwritten elements show as NaN
    raw.vec_add(x, y, out=out)
    ref = x.double() + y.double()
    assert not torch.isnan(out).any()
    _assert_one_rounding(out, ref, dtype)
    expected = "triton-interpret" if _device() == "cpu" else "triton"
    assert observe.last_implementation("vec_add") == expected


def test_raw_vec_add_rejects_bad_input() -> None:
    x = torch.randn(8)
    with pytest.raises(raw.GretaInputError, match="argument 'y' has dtype"):
        raw.vec_add(x, torch.randn(8, dtype=torch.float64))
    with pytest.raises(raw.GretaInputError, match="shapes must match"):
        raw.vec_add(x, torch.randn(9))
    with pytest.raises(raw.GretaInputError, match="argument 'x' must be contiguous"):
        raw.vec_add(torch.randn(8, 2).t(), torch.randn(2, 8))


def test_torch_op_vec_add_and_autograd() -> None:
    import greta_core.torch  # noqa: F401

    x = torch.randn(300, device=_device(), requires_grad=True)
    y = torch.randn(300, device=_device(), requires_grad=True)
    out = torch.ops.greta.vec_add(x, y)
    assert torch.allclose(out, x + y)
    out.sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))
    torch.library.opcheck(torch.ops.greta.vec_add.default, (x.detach(), y.detach()))
    # The front's triton_op (autograd and torch.compile go through it).
    torch.library.opcheck(torch.ops.greta.vec_add_fwd.default, (x, y))


def test_jax_vec_add() -> None:
    jnp = pytest.importorskip("jax.numpy")
    from greta_core import jax as gjax

    a = jnp.arange(37, dtype=jnp.float32)
    out = gjax.vec_add(a, a * 2)
    assert float(abs(out - a * 3).max()) == 0.0
    assert observe.last_implementation("vec_add") == expected_jax_impl()
