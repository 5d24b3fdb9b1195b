"""Helpers for the kernel tests: device choice, tolerances, poisoned buffers."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from greta_core.arch import interpreter_active  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ON_GPU = DEVICE == "cuda"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def need_triton() -> None:
    if not ON_GPU and not interpreter_active():
        pytest.skip("raw Triton on CPU needs TRITON_INTERPRET=1")


def tol(dtype: torch.dtype) -> float:
    return {torch.float32: 2e-5, torch.float16: 5e-3, torch.bfloat16: 2e-2}[dtype]


def order_tol(dtype: torch.dtype, terms: int, ref: torch.Tensor) -> dict[str, float]:
    """rtol/atol for two evaluations of the same maths in different orders (eager vs
    compiled, interpreter vs reference, two kernel compilations).

    Any order of summing `terms` products is within (terms - 1) * u * sum|x_i| of the exact
    sum (Higham, Accuracy and Stability, 4.2), so two orders are within twice that; with
    sum|x_i| bounded by `terms` times the largest term, and the largest output magnitude
    standing for it, atol = 2 * terms * u * max|ref| (and the same relative bound). Near-zero
    outputs of a cancelling sum are covered by atol; their relative error is unbounded.
    `terms` is the longest chain of accumulations behind one output (the sum of the
    reduction lengths a value passes through, forward and backward).
    """
    u = torch.finfo(dtype).eps / 2
    bound = 2.0 * terms * u
    scale = max(ref.detach().abs().max().item(), 1.0) if ref.numel() else 1.0
    return {"rtol": bound, "atol": bound * scale}


def poisoned(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)


def assert_close(
    out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, scale: float = 1.0
) -> None:
    """Relative to the reference's magnitude; NaN never passes."""
    assert not torch.isnan(out).any(), "NaN in output (unwritten or invalid elements)"
    err = (out.double() - ref.double()).abs().max().item()
    mag = max(ref.double().abs().max().item(), 1.0)
    assert err <= tol(dtype) * mag * scale, f"max abs err {err:.3e} (magnitude {mag:.3e})"


def expected_impl() -> str:
    """What the torch ops and raw launches run here: the conftest puts a GPU-less machine
    on Triton's interpreter, so a fallback to the torch reference is a failure."""
    return "triton" if ON_GPU else "triton-interpret"


def expected_jax_impl() -> str:
    """What greta_core.jax runs here: jax-triton wherever JAX sees a GPU (the GPU suite
    carries the jax-triton wheel), the jax.numpy reference elsewhere."""
    import jax

    return "jax-triton" if jax.default_backend() in ("gpu", "cuda", "rocm") else "reference-jnp"


def graph_recorder() -> tuple[list[set[str]], Any]:
    """(graphs, backend): a torch.compile backend that records the call targets of each
    graph it sees, dynamo's first, then AOTAutograd's forward and backward."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs: list[set[str]] = []

    def grab(gm, _example_inputs):  # type: ignore[no-untyped-def]
        graphs.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return make_boxed_func(gm.forward)

    aot = aot_autograd(fw_compiler=grab, bw_compiler=grab)

    def backend(gm, example_inputs):  # type: ignore[no-untyped-def]
        grab(gm, example_inputs)
        return aot(gm, example_inputs)

    return graphs, backend


class PassthroughMode(TorchDispatchMode):
    """A dispatch mode that changes nothing: its presence alone must send GRETA's eager
    fronts to their torch ops."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        return func(*args, **(kwargs or {}))


def cuda_stand_in(monkeypatch: pytest.MonkeyPatch) -> type:
    """A tensor subclass that reports ``is_cuda`` and that ops._calls' eager checks count as
    plain (patched into its probes for the test): the eager paths' checks on a CPU."""
    from greta_core.ops import _calls

    class CudaLike(torch.Tensor):
        is_cuda = True
        __torch_function__ = torch._C._disabled_torch_function_impl

    probes = _calls._PROBES or _calls._eager_probes()
    monkeypatch.setattr(_calls, "_PROBES", (*probes[:4], (*probes[4], CudaLike), *probes[5:]))
    return CudaLike
