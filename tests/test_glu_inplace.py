"""swiglu/geglu backward into gate's and up's memory: only for callers that own them.

``consume_inputs()`` (what apply_greta's MLP uses) lets the GPU backward write dgate over
gate and dup over up; a user's own tensors are never overwritten. Gradients are the same
either way.
"""

from __future__ import annotations

import contextlib

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from _kernel_testing import DEVICE, ON_GPU, need_triton  # noqa: E402

import greta_core.torch  # noqa: E402, F401
from greta_core.ops import swiglu as glu_ops  # noqa: E402
from greta_core.torch._common import consume_inputs  # noqa: E402


@pytest.mark.parametrize("op", ["swiglu", "geglu"])
def test_raw_inplace_backward_equals_the_out_of_place_one(op: str) -> None:
    need_triton()
    gen = torch.Generator().manual_seed(5)
    gate, up, dy = (torch.randn(3, 40, generator=gen).to(DEVICE, torch.bfloat16) for _ in range(3))
    want = glu_ops.glu_bwd(op, dy, gate, up)
    g2, u2 = gate.clone(), up.clone()
    got = glu_ops.glu_bwd_inplace(op, dy, g2, u2)
    assert got[0].data_ptr() == g2.data_ptr() and got[1].data_ptr() == u2.data_ptr()
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def _mlp_grads(consume: bool, dtype: torch.dtype):
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(64, 32, generator=gen).to(DEVICE, dtype).requires_grad_()
    w1, w2 = (torch.randn(32, 96, generator=gen).to(DEVICE, dtype) / 6 for _ in range(2))
    gate, up = x @ w1, x @ w2
    with consume_inputs() if consume else contextlib.nullcontext():
        y = torch.ops.greta.swiglu(gate, up)
    kept = gate.detach().clone()
    y.backward(torch.ones_like(y))
    return x.grad, torch.equal(gate.detach(), kept)


def test_consuming_backward_gives_the_same_gradients() -> None:
    dtype = torch.bfloat16 if ON_GPU else torch.float32
    g_plain, plain_kept = _mlp_grads(False, dtype)
    g_consumed, consumed_kept = _mlp_grads(True, dtype)
    assert torch.equal(g_plain, g_consumed)
    assert plain_kept  # a user's tensors are never overwritten
    # On a GPU the Triton backward reused gate's memory; the CPU reference never does.
    assert consumed_kept == (not ON_GPU)


@pytest.mark.skipif(not ON_GPU, reason="GPU test: peak memory of the CUDA caching allocator")
def test_consuming_backward_allocates_no_gate_sized_buffers() -> None:
    def backward_peak(consume: bool) -> int:
        """The peak of the GLU's own backward: read when its gradients are ready, before
        the GEMMs' backward runs (whose cuBLAS workspace, 32 MiB under torch 2.15, comes
        from the same allocator and would hide the difference)."""
        x = torch.randn(4096, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = torch.randn(256, 2048, device="cuda", dtype=torch.bfloat16) / 16
        gate, up = x @ w, x @ w
        with consume_inputs() if consume else contextlib.nullcontext():
            y = torch.ops.greta.swiglu(gate, up)
        peaks: list[int] = []

        def at_gate_grad(grad: torch.Tensor) -> torch.Tensor:
            torch.cuda.synchronize()
            peaks.append(torch.cuda.max_memory_allocated())
            return grad

        # Both GEMMs' backward nodes wait on these gradients: the first hook to fire runs
        # before either of them (their order is the engine's).
        gate.register_hook(at_gate_grad)
        up.register_hook(at_gate_grad)
        dy = torch.ones_like(y)
        del gate, up
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        y.backward(dy)
        torch.cuda.synchronize()
        assert len(peaks) == 2
        return peaks[0] - base

    gate_bytes = 4096 * 2048 * 2
    assert backward_peak(False) - backward_peak(True) >= 2 * gate_bytes * 0.9
