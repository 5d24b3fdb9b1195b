"""The backward's in-place scale of the forward-computed gradients (``scale_in_place``).

``loss.backward()`` hands linear_cross_entropy an incoming gradient of exactly 1: the kernel
then leaves the gradients as they are (no pass over the [vocab, hidden] weight gradient);
any other value scales every element in float32 and rounds once, as a multiply would.
Runs the real kernel (Triton's interpreter on the CPU).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from _kernel_testing import DEVICE  # noqa: E402

from greta_core.ops.linear_cross_entropy import scale_in_place  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _x(n: int, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(5)
    return (torch.randn(n, generator=gen) * 3).to(DEVICE, dtype)


def _ulp(t: torch.Tensor) -> torch.Tensor:
    """One unit in the last place of each element of t (t's dtype; float32 result)."""
    mant = torch.finfo(t.dtype).eps
    return t.float().abs().clamp(min=torch.finfo(t.dtype).tiny) * mant


@pytest.mark.parametrize("dtype", DTYPES)
def test_scale_one_leaves_every_element(dtype: torch.dtype) -> None:
    x = _x(9000, dtype)  # more than one block: every program returns early
    want = x.clone()
    version = x._version
    assert scale_in_place(x, torch.ones((), device=DEVICE)) is x
    assert torch.equal(x, want)
    assert x._version > version  # autograd sees a write either way


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("value", [0.37, -2.0, 0.0])
def test_scale_multiplies_in_float32_and_rounds_once(dtype: torch.dtype, value: float) -> None:
    x = _x(9000, dtype)
    want = x.float() * value
    scale_in_place(x, torch.tensor(value, device=DEVICE))
    # One rounding of the float32 product to x's dtype: within one unit in its last place
    # (Triton's interpreter may truncate where the GPU rounds to nearest).
    err = (x.float() - want).abs()
    assert bool((err <= _ulp(want.to(dtype))).all()), float(err.max())


def test_scale_nan_reaches_every_element() -> None:
    x = _x(9000, torch.bfloat16)
    scale_in_place(x, torch.tensor(float("nan"), device=DEVICE))
    assert bool(x.isnan().all())


def test_scale_of_a_strided_gradient_is_a_multiply() -> None:
    base = _x(200, torch.float32).reshape(20, 10)
    x = base.t()  # not contiguous: no flat view for the kernel
    want = base.t() * 0.5
    assert scale_in_place(x, torch.tensor(0.5, device=DEVICE)) is x
    torch.testing.assert_close(base.t(), want, rtol=0, atol=0)


def test_scale_of_nothing() -> None:
    x = torch.empty(0, 7, device=DEVICE, dtype=torch.bfloat16)
    assert scale_in_place(x, torch.tensor(3.0, device=DEVICE)).shape == (0, 7)
