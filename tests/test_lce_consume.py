"""linear_cross_entropy writes dhidden over hidden's memory, only for callers that own it.

Inside ``consume_inputs()`` (what apply_greta's causal-LM loss enters) the Triton path's
forward writes the hidden gradient over ``hidden``: the forward's peak holds one
[tokens, hidden] tensor less. Loss and gradients are the same either way; a user's tensors
are never overwritten without the context manager; a tensor another backward saved makes
that backward raise instead of reading the gradient.
"""

from __future__ import annotations

import contextlib

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from _kernel_testing import (  # noqa: E402
    DEVICE,
    ON_GPU,
    assert_close,
    expected_impl,
    need_triton,
    order_tol,
)

import greta_core.torch  # noqa: E402, F401
from greta_core import configs, observe  # noqa: E402
from greta_core import raw as greta_raw  # noqa: E402
from greta_core.errors import GretaInputError  # noqa: E402
from greta_core.torch._common import consume_inputs  # noqa: E402

DTYPE = torch.bfloat16 if ON_GPU else torch.float32


@pytest.fixture(autouse=True)
def _kernel_path():
    """The Triton path is this file's subject: its small cases are where a GPU arch's table
    (sm_90: tokens <= hidden) hands the call to torch, which never consumes its inputs."""
    with configs.Override({"linear_cross_entropy_dispatch": {"backend": "greta"}}):
        yield


def _case(n: int = 10, h: int = 16, v: int = 40, dtype: torch.dtype = DTYPE, seed: int = 4):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=gen).to(DEVICE, dtype)
    weight = (torch.randn(v, h, generator=gen) / 4).to(DEVICE, dtype)
    target = torch.randint(0, v, (n,), generator=gen).to(DEVICE)
    target[2] = -100
    return hidden, weight, target


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


# --- the raw API -------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_raw_dh_into_hidden_returns_hidden_holding_the_same_gradients(reduction: str) -> None:
    need_triton()
    hidden, weight, target = _case()
    want = greta_raw.linear_cross_entropy_fwd(hidden, weight, target, -100, reduction, True)
    mine = hidden.clone()
    loss, dh, dw = greta_raw.linear_cross_entropy_fwd(
        mine, weight, target, -100, reduction, True, dh_into_hidden=True
    )
    assert observe.last_implementation("linear_cross_entropy") == expected_impl()
    assert dh is mine
    # Each chunk's dweight share read the hidden rows before dhidden overwrote them: the
    # very same products as with a separate dhidden.
    assert torch.equal(loss, want[0])
    assert torch.equal(dh, want[1])
    assert torch.equal(dw, want[2])
    assert not torch.equal(mine, hidden)


@pytest.mark.parametrize(
    ("with_grad", "reduction", "transposed"),
    [(False, "mean", False), (True, "none", False), (True, "mean", True)],
)
def test_raw_dh_into_hidden_refuses_what_it_cannot_do(
    with_grad: bool, reduction: str, transposed: bool
) -> None:
    hidden, weight, target = _case(n=16, h=16)
    if transposed:
        hidden = hidden.t()
    kept = hidden.clone()
    with pytest.raises(GretaInputError, match="dh_into_hidden=True needs"):
        greta_raw.linear_cross_entropy_fwd(
            hidden, weight, target, -100, reduction, with_grad, dh_into_hidden=True
        )
    assert torch.equal(hidden, kept)


# --- torch.ops.greta.linear_cross_entropy under consume_inputs() -------------------------


def _op_run(consume: bool, reduction: str = "mean"):
    """Loss, (dhidden, dweight), hidden before and after the forward, and hidden itself."""
    base, weight, target = _case()
    base.requires_grad_()
    weight.requires_grad_()
    hidden = base * 1.0  # an intermediate, as the final norm's output is in a model
    before = hidden.detach().clone()
    with consume_inputs() if consume else contextlib.nullcontext():
        loss = torch.ops.greta.linear_cross_entropy(hidden, weight, target, -100, reduction)
    after = hidden.detach().clone()
    grads = torch.autograd.grad(loss * 0.5, (hidden, weight))
    return loss.detach(), grads, (before, after), hidden


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_consume_gives_the_same_loss_and_grads_and_reuses_hidden(reduction: str) -> None:
    need_triton()
    loss, (dh, dw), (before, after), plain_hidden = _op_run(False, reduction)
    assert torch.equal(after, before)  # without the context manager: untouched
    assert torch.equal(plain_hidden.detach(), before)
    assert _storage(dh) != _storage(plain_hidden)

    c_loss, (c_dh, c_dw), (_, consumed_after), consumed_hidden = _op_run(True, reduction)
    assert observe.last_implementation("linear_cross_entropy") == expected_impl()
    assert_close(c_loss, loss, DTYPE)
    assert_close(c_dh, dh, DTYPE)
    assert_close(c_dw, dw, DTYPE)
    # The forward left the unscaled hidden gradient (2 * dh: the loss was halved) in hidden.
    assert_close(consumed_after, 2 * dh, DTYPE)
    if ON_GPU:
        # The device backward scales that memory in place: the gradient *is* hidden's memory.
        assert _storage(c_dh) == _storage(consumed_hidden)


def _declined(case: str):
    base, weight, target = _case(n=16, h=16)
    base.requires_grad_()
    weight.requires_grad_()
    reduction = "mean"
    if case == "leaf":
        hidden = base
    elif case == "non_contiguous":  # an intermediate, but the raw API would copy it
        hidden = base.t().contiguous().t()
    elif case == "reduction_none":
        hidden, reduction = base * 1.0, "none"
    elif case == "no_grad_mode":
        hidden = base * 1.0
    else:  # float64 takes the torch reference: no fresh dhidden there to save
        hidden, weight = base.double() * 1.0, weight.detach().double().requires_grad_()
    assert hidden.is_leaf == (case == "leaf")
    assert hidden.is_contiguous() == (case != "non_contiguous")
    return hidden, weight, target, reduction, case == "no_grad_mode"


@pytest.mark.parametrize(
    "case", ["leaf", "non_contiguous", "reduction_none", "no_grad_mode", "float64"]
)
def test_consume_leaves_hidden_alone_where_it_saves_nothing(case: str) -> None:
    hidden, weight, target, reduction, no_grad = _declined(case)
    kept = hidden.detach().clone()
    with consume_inputs(), torch.no_grad() if no_grad else contextlib.nullcontext():
        loss = torch.ops.greta.linear_cross_entropy(hidden, weight, target, -100, reduction)
    assert torch.equal(hidden.detach(), kept)
    if loss.requires_grad:
        loss.sum().backward()


def test_hidden_saved_by_another_backward_makes_that_backward_raise() -> None:
    need_triton()
    base, weight, target = _case()
    base.requires_grad_()
    # tanh's backward reads its output: plain, that works.
    torch.ops.greta.linear_cross_entropy(torch.tanh(base), weight, target).backward()
    hidden = torch.tanh(base)
    with consume_inputs():
        loss = torch.ops.greta.linear_cross_entropy(hidden, weight, target)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


# --- apply_greta's causal-LM loss -------------------------------------------------------


def test_causal_lm_consumes_final_hidden_unless_hidden_states_are_returned() -> None:
    transformers = pytest.importorskip("transformers")
    need_triton()
    from greta_core.transformers import apply_greta, revert_greta

    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, vocab_size=96, max_position_embeddings=32,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(DEVICE)
    # Only the loss is GRETA's (through the interpreter on CPU): the rest stays cheap.
    only_loss = dict(rms_norm=False, rope=False, attention=False, swiglu=False)
    apply_greta(model, add_rms_norm=False, **only_loss)
    captured: list[tuple[torch.Tensor, torch.Tensor]] = []

    def keep_norm_output(_module, _args, out: torch.Tensor) -> None:
        captured.append((out, out.detach().clone()))

    model.model.norm.register_forward_hook(keep_norm_output)
    ids = torch.randint(1, 96, (2, 6), generator=torch.Generator().manual_seed(2)).to(DEVICE)
    model.train()
    try:
        runs = {}
        for returned in (True, False):
            model.zero_grad()
            captured.clear()
            out = model(ids, labels=ids, output_hidden_states=returned)
            assert out.logits is None  # the fused loss ran
            assert (out.hidden_states is not None) == returned
            out.loss.backward()
            (final, as_made) = captured[-1]
            overwritten = not torch.equal(final.detach(), as_made)
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
            runs[returned] = (out.loss.detach(), grads, overwritten)
    finally:
        revert_greta(model)
    assert runs[True][2] is False  # returned to the caller: never overwritten
    assert runs[False][2] is True  # the model's own: dhidden went over it
    # The same maths either way (test_transformers.py's tolerance covers a GPU's SDPA).
    # Each parameter's gradient sums over the batch's tokens and the model's widths in an
    # order that may differ between the runs; the tiny model's longest chain is well under
    # 4096 accumulations.
    torch.testing.assert_close(
        runs[False][0], runs[True][0], **order_tol(torch.float32, 4096, runs[True][0])
    )
    for name, g in runs[True][1].items():
        tol = order_tol(torch.float32, 4096, g)
        torch.testing.assert_close(runs[False][1][name], g, **tol, msg=name)


# --- GPU: the forward's peak --------------------------------------------------------------


@pytest.mark.skipif(not ON_GPU, reason="GPU test: peak memory of the CUDA caching allocator")
def test_consuming_forward_peak_is_lower_by_hiddens_size() -> None:
    def forward_peak(consume: bool) -> tuple[int, int]:
        gen = torch.Generator(device="cuda").manual_seed(1)
        base = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16, generator=gen)
        weight = torch.randn(32000, 1024, device="cuda", dtype=torch.bfloat16, generator=gen)
        weight = (weight / 32).requires_grad_()
        target = torch.randint(0, 32000, (4096,), device="cuda", generator=gen)
        base.requires_grad_()
        hidden = base * 1.0
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        with consume_inputs() if consume else contextlib.nullcontext():
            loss = torch.ops.greta.linear_cross_entropy(hidden, weight, target)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
        assert observe.last_implementation("linear_cross_entropy") == "triton"
        del loss
        return peak, hidden.numel() * hidden.element_size()

    forward_peak(False)  # one-time allocations (cuBLAS workspace, kernel loads) go here
    plain, hidden_bytes = forward_peak(False)
    consumed, _ = forward_peak(True)
    assert plain - consumed >= 0.9 * hidden_bytes, (plain, consumed, hidden_bytes)
