"""linear_cross_entropy refuses a target that is no class (issue 30 item 8): >= vocab, or
negative and not ignore_index. It returned a finite loss in every binding; torch raises."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from _kernel_testing import DEVICE  # noqa: E402

import greta_core.torch  # noqa: E402, F401
from greta_core import raw  # noqa: E402
from greta_core.errors import GretaInputError  # noqa: E402

VOCAB = 11
BAD = [VOCAB, VOCAB + 5, 2**40, -1, -7, -(2**40)]


def _case(bad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    hidden = torch.randn(5, 8, device=DEVICE)
    weight = torch.randn(VOCAB, 8, device=DEVICE)
    target = torch.tensor([0, 3, -100, bad, 2], device=DEVICE)
    return hidden, weight, target


@pytest.mark.parametrize("bad", BAD)
def test_torch_refuses_it_too(bad: int) -> None:
    # On the CPU: on a GPU torch's refusal is a device-side assert, which would poison
    # the CUDA context of every later test in this process.
    hidden, weight, target = (t.cpu() for t in _case(bad))
    with pytest.raises((IndexError, RuntimeError)):
        torch.nn.functional.cross_entropy(hidden @ weight.t(), target)


@pytest.mark.parametrize("bad", BAD)
def test_raw_binding_refuses_a_target_outside_the_vocabulary(bad: int) -> None:
    hidden, weight, target = _case(bad)
    with pytest.raises(GretaInputError, match=f"holds {bad}; every entry must be in"):
        raw.linear_cross_entropy(hidden, weight, target)
    scale = torch.ones(5, device=DEVICE)
    with pytest.raises(GretaInputError, match="every entry must be in"):
        raw.linear_cross_entropy_bwd(hidden, weight, target, scale)


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_torch_op_refuses_a_target_outside_the_vocabulary(bad: int, reduction: str) -> None:
    hidden, weight, target = _case(bad)
    with pytest.raises(GretaInputError, match="every entry must be in"):
        torch.ops.greta.linear_cross_entropy(hidden, weight, target, -100, reduction)


def test_ignore_index_is_still_allowed_and_a_negative_one_too() -> None:
    hidden, weight, target = _case(-1)
    target[2] = VOCAB - 1
    loss = raw.linear_cross_entropy(hidden, weight, target, ignore_index=-1, reduction="none")
    assert torch.isfinite(loss).all() and loss[3].item() == 0.0


@pytest.mark.parametrize("bad", [VOCAB, -1, -7])
def test_jax_binding_refuses_a_target_outside_the_vocabulary(bad: int) -> None:
    jnp = pytest.importorskip("jax.numpy")
    from greta_core import jax as gjax

    hidden = jnp.ones((5, 8), jnp.float32)
    weight = jnp.ones((VOCAB, 8), jnp.float32)
    target = jnp.array([0, 3, -100, bad, 2])
    with pytest.raises(GretaInputError, match="every entry must be in"):
        gjax.linear_cross_entropy(hidden, weight, target)
