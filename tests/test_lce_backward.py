"""linear_cross_entropy's backward hands over the gradients its forward computed.

``loss.backward()`` must not copy dweight ([vocab, hidden]) at the train step's peak, and
every other upstream gradient (a scaled loss, a retained graph run twice) must still be
exact. Values are checked against float64 autograd of the unfused maths.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from _kernel_testing import DEVICE, ON_GPU  # noqa: E402

import greta_core.torch  # noqa: E402, F401

F = torch.nn.functional


def _inputs(n: int, h: int, v: int, dtype: torch.dtype, device: str = "cpu"):
    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(n, h, generator=gen, dtype=torch.float64).to(device, dtype)
    weight = (torch.randn(v, h, generator=gen, dtype=torch.float64) / 4).to(device, dtype)
    target = torch.randint(0, v, (n,), generator=gen).to(device)
    target[1] = -100
    return hidden.requires_grad_(), weight.requires_grad_(), target


def _reference_grads(hidden, weight, target, scale: float):
    h, w = (t.detach().double().cpu().requires_grad_() for t in (hidden, weight))
    loss = F.cross_entropy(h @ w.t(), target.cpu(), ignore_index=-100) * scale
    return torch.autograd.grad(loss, (h, w))


@pytest.mark.parametrize("scale", [1.0, 0.25])
def test_backward_gradients_for_plain_and_scaled_loss(scale: float) -> None:
    hidden, weight, target = _inputs(6, 8, 11, torch.float32)
    (torch.ops.greta.linear_cross_entropy(hidden, weight, target) * scale).backward()
    want_h, want_w = _reference_grads(hidden, weight, target, scale)
    torch.testing.assert_close(hidden.grad.double(), want_h, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(weight.grad.double(), want_w, rtol=1e-5, atol=1e-6)


def test_retained_graph_backward_twice_accumulates_exactly() -> None:
    hidden, weight, target = _inputs(6, 8, 11, torch.float32)
    loss = torch.ops.greta.linear_cross_entropy(hidden, weight, target)
    loss.backward(retain_graph=True)
    loss.backward()
    want_h, want_w = _reference_grads(hidden, weight, target, 2.0)
    torch.testing.assert_close(hidden.grad.double(), want_h, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(weight.grad.double(), want_w, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not ON_GPU, reason="GPU test: peak memory of the CUDA caching allocator")
def test_backward_allocates_no_second_dweight() -> None:
    # bf16 [32768, 1024] weight: a copy of dweight would be 64 MiB; the backward may allocate
    # only small things (the loss' own gradient, scalars).
    # The kernel's forward-computed gradients are the subject: 256 tokens at hidden 1024 is
    # where the sm_90 table hands the call to torch, whose backward makes dweight itself.
    from greta_core import configs

    hidden, weight, target = _inputs(256, 1024, 32768, torch.bfloat16, DEVICE)
    with configs.Override({"linear_cross_entropy_dispatch": {"backend": "greta"}}):
        loss = torch.ops.greta.linear_cross_entropy(hidden, weight, target)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss.backward()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before
    assert extra < weight.numel() * weight.element_size() // 4, f"backward allocated {extra} B"


def test_create_graph_keeps_the_gradients_functions_of_the_upstream_gradient() -> None:
    # d/ds of sum(dloss/dhidden) for loss*s is sum(dloss/dhidden) itself: the scaled
    # gradients must stay in the graph (an in-place kernel scale would cut them out of it).
    from greta_core import configs

    dtype = torch.bfloat16 if ON_GPU else torch.float32
    hidden, weight, target = _inputs(6, 8, 11, dtype, DEVICE)
    s = torch.tensor(0.75, device=DEVICE, requires_grad=True)
    with configs.Override({"linear_cross_entropy_dispatch": {"backend": "greta"}}):
        loss = torch.ops.greta.linear_cross_entropy(hidden, weight, target)
    (dh,) = torch.autograd.grad(loss * s, (hidden,), create_graph=True)
    (ds,) = torch.autograd.grad(dh.float().sum(), (s,))
    ref = _reference_grads(hidden, weight, target, 1.0)[0]
    # Each entry within a few roundings of the kernels' dtype (bf16 logits on the GPU): the
    # sum's error is bounded by that share of the entries' absolute sum.
    tol = 4 * torch.finfo(dtype).eps * ref.abs().sum().item()
    assert abs(ds.item() - ref.sum().item()) <= tol


@pytest.mark.parametrize(
    ("scale", "rows"), [(1, 256), (2, 512), (4, 1024), (0, 256), (10_000, 8192)]
)
def test_chunk_scale_trades_memory_for_fewer_chunks(scale: int, rows: int) -> None:
    from greta_core.ops import linear_cross_entropy as lce

    assert lce.chunk_rows(8192, 128256, 2048, scale) == rows
    spans = lce.chunks(8192, 128256, 2048, scale)
    assert spans[0] == (0, rows) and spans[-1][1] == 8192 and len(spans) == -(-8192 // rows)


def test_chunk_scale_comes_from_the_config_table() -> None:
    from greta_core import configs
    from greta_core.ops import linear_cross_entropy as lce

    for arch in ("sm_90", "gfx942", "gfx1100", "cpu"):
        features = lce.dispatch_features(8192, 128256, 2048)
        want = configs.lookup(lce.OP, arch, features).get("CHUNK_SCALE", 1)
        assert lce.chunk_schedule(arch, 8192, 128256, 2048)[0] == want


@pytest.mark.skipif(not ON_GPU, reason="GPU test: the device path scales the saved gradients")
def test_gpu_retained_graph_second_backward_is_refused() -> None:
    hidden, weight, target = _inputs(64, 32, 128, torch.bfloat16, DEVICE)
    loss = torch.ops.greta.linear_cross_entropy(hidden, weight, target)
    (loss * 0.5).backward(retain_graph=True)
    want_h, want_w = _reference_grads(hidden, weight, target, 0.5)
    torch.testing.assert_close(hidden.grad.double().cpu(), want_h, rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(weight.grad.double().cpu(), want_w, rtol=2e-2, atol=2e-3)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        (loss * 0.5).backward()


@pytest.mark.parametrize("n", [40, 0])
def test_first_chunk_writes_dweight_over_uninitialised_memory(n: int, monkeypatch) -> None:
    # dweight starts as torch.empty_like: the first chunk must overwrite it (torch.mm out=)
    # and zero rows must still give zeros. NaN-filled "fresh" memory makes a read show.
    from greta_core import configs
    from greta_core.ops import linear_cross_entropy as lce

    real = torch.empty_like
    monkeypatch.setattr(torch, "empty_like", lambda t, **kw: real(t, **kw).fill_(float("nan")))
    hidden, weight, target = _inputs(max(n, 2), 16, 64, torch.float32, DEVICE)
    hidden, target = hidden.detach()[:n], target[:n]
    with configs.Override({lce.OP: {"CHUNK_SCALE": 1, "CHUNK_FLOOR": 0.0}}):
        assert len(lce.chunks(n, 64, 16, 1)) == (3 if n else 0)
        _, _, dw = lce.linear_cross_entropy_fwd(hidden, weight.detach(), target, -100, "sum", True)
    if n:
        want = _reference_grads(hidden, weight, target, 1.0)[1]
        want *= (target != -100).sum().cpu()  # "sum": the reference's mean times the count
        torch.testing.assert_close(dw.double().cpu(), want, rtol=1e-4, atol=1e-5)
    else:
        assert torch.equal(dw, torch.zeros_like(dw))
