"""GretaGraph: capture a sequence of GRETA/GretaCompute calls once, replay it cheaply.

On a GPU this is a CUDA Graph (HIP Graph on ROCm: ``torch.cuda.CUDAGraph`` is the same API
there). Inputs live in static buffers: a replay copies new values into them and re-runs the
recorded kernels, returning the same static output tensors (clone them to keep a result).
Dispatch decisions (which implementation each GretaCompute op uses) are taken during capture
and frozen into the graph. On the CPU the function simply runs eagerly.

`fn` runs `warmup` times before capture (side stream, as the torch docs require, so lazy
initialisation and Triton compilation happen outside the graph); in-place effects such as a
KV-cache append must therefore be idempotent for the same inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from greta_core.errors import GretaInputError, GretaTypeError


def _is_tensor(x: Any) -> bool:
    return hasattr(x, "data_ptr") and hasattr(x, "copy_")


def _on_gpu(inputs: Sequence[Any]) -> bool:
    tensors = [x for x in inputs if _is_tensor(x)]
    return bool(tensors) and all(t.device.type == "cuda" for t in tensors)


class GretaGraph:
    """A captured (GPU) or eager (CPU) callable over fixed-shape static inputs."""

    def __init__(
        self, fn: Callable[..., Any], *static_inputs: Any, warmup: int = 3, pool: Any = None
    ) -> None:
        self.fn = fn
        self.static_inputs = tuple(static_inputs)
        self.static_outputs: Any = None
        self._graph: Any = None
        self.mode = "eager"
        if _on_gpu(self.static_inputs):
            self._capture(max(1, warmup), pool)

    @property
    def backend(self) -> str:
        """ "cuda-graph", "hip-graph" or "eager"."""
        return self.mode

    def _capture(self, warmup: int, pool: Any) -> None:
        import torch

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                self.fn(*self.static_inputs)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            self.static_outputs = self.fn(*self.static_inputs)
        self._graph = graph
        self.mode = "hip-graph" if getattr(torch.version, "hip", None) else "cuda-graph"

    def pool(self) -> Any:
        """Memory pool handle to share with a further capture (graphs replayed in order)."""
        return None if self._graph is None else self._graph.pool()

    def _load(self, inputs: Sequence[Any]) -> None:
        if len(inputs) != len(self.static_inputs):
            raise GretaTypeError(
                f"GretaGraph: captured with {len(self.static_inputs)} inputs, called with {len(inputs)}"
            )
        for i, (static, new) in enumerate(zip(self.static_inputs, inputs, strict=True)):
            if new is static:
                continue
            if _is_tensor(static):
                if tuple(new.shape) != tuple(static.shape):
                    raise GretaInputError(
                        f"GretaGraph: input {i} has shape {tuple(new.shape)}; the graph was "
                        f"captured for {tuple(static.shape)} (capture another graph per shape)"
                    )
                static.copy_(new)
            elif new != static:
                raise GretaInputError(
                    f"GretaGraph: input {i} is the constant {static!r} in the captured graph; got {new!r}"
                )

    def __call__(self, *inputs: Any) -> Any:
        if self._graph is None:
            return self.fn(*(inputs or self.static_inputs))
        if inputs:
            self._load(inputs)
        self._graph.replay()
        return self.static_outputs

    def replay(self) -> Any:
        """Re-run on whatever the static inputs hold now."""
        return self()


def capture(
    fn: Callable[..., Any], *static_inputs: Any, warmup: int = 3, pool: Any = None
) -> GretaGraph:
    """Capture ``fn(*static_inputs)``; call the result with new inputs of the same shapes."""
    return GretaGraph(fn, *static_inputs, warmup=warmup, pool=pool)
