"""attention with head dim 0 (issue 30 item 8): a clear GretaInputError in every binding,
not ZeroDivisionError from the default scale 1/sqrt(D)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from _kernel_testing import DEVICE  # noqa: E402

import greta_core.torch  # noqa: E402, F401
from greta_core import raw  # noqa: E402
from greta_core.errors import GretaInputError  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(1, 2, 4, 0), (2, 1, 1, 0), (1, 1, 0, 0)])
def test_torch_and_raw_refuse_head_dim_zero(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    q = torch.randn(shape, device=DEVICE, dtype=dtype)
    calls = [lambda: torch.ops.greta.attention(q, q, q), lambda: raw.attention(q, q, q)]
    calls.append(lambda: torch.ops.greta.attention(q, q, q, True, 0.5))
    for call in calls:
        with pytest.raises(GretaInputError, match=r"head dim must be >= 1|has dtype"):
            call()


def test_jax_refuses_head_dim_zero() -> None:
    jnp = pytest.importorskip("jax.numpy")
    from greta_core import jax as gjax

    q = jnp.zeros((1, 2, 4, 0), jnp.float16)
    with pytest.raises(GretaInputError):
        gjax.attention(q, q, q)
