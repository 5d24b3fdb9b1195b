"""GretaGraph (eager on CPU, CUDA/HIP graph on GPU) and greta_core.compile."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from greta_core import compute  # noqa: E402
from greta_core.compile import choose_backend, compile  # noqa: E402
from greta_core.compute import GretaUnavailableError  # noqa: E402
from greta_core.graph import capture  # noqa: E402


def _step(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return compute.softmax(compute.rms_norm(compute.matmul(x, w), g))


def test_cpu_graph_runs_eagerly() -> None:
    x, w, g = torch.randn(4, 8), torch.randn(8, 16), torch.randn(16)
    graph = capture(_step, x, w, g)
    assert graph.backend == "eager"
    x2 = torch.randn(4, 8)
    assert torch.equal(graph(x2, w, g), _step(x2, w, g))
    assert torch.equal(graph(), _step(x, w, g))


@pytest.mark.gpu
def test_gpu_graph_capture_and_replay() -> None:
    dtype = compute.default_dtype("cuda")
    x = torch.randn(4, 64, device="cuda", dtype=dtype)
    w = torch.randn(64, 96, device="cuda", dtype=dtype)
    g = torch.randn(96, device="cuda", dtype=dtype)
    graph = capture(_step, x, w, g)
    assert graph.backend in ("cuda-graph", "hip-graph")
    for _ in range(3):
        new = torch.randn(4, 64, device="cuda", dtype=dtype)
        out = graph(new, w, g)
        assert torch.allclose(out.float(), _step(new, w, g).float(), atol=1e-2, rtol=1e-2)
    with pytest.raises(ValueError, match="captured for"):
        graph(torch.randn(5, 64, device="cuda", dtype=dtype), w, g)


def test_compile_reports_backend_and_matches_eager() -> None:
    module = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU())
    compiled = compile(module, backend="aot_eager")
    assert compiled.backend == "aot_eager" and compiled.reason == "forced"
    x = torch.randn(3, 8)
    assert torch.allclose(compiled(x), module(x))


def test_compile_auto_choice_and_forced_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    name, _why = choose_backend()
    if not torch.cuda.is_available():
        assert name in ("inductor", "aot_eager")
        with pytest.raises(GretaUnavailableError, match="TensorRT needs an NVIDIA GPU"):
            choose_backend("tensorrt")
        monkeypatch.setenv("GRETA_COMPILE_BACKEND", "migraphx")
        with pytest.raises(GretaUnavailableError, match="MIGraphX needs a ROCm GPU"):
            choose_backend()
    with pytest.raises(ValueError, match="unknown compile backend"):
        choose_backend("xla")
