"""The eager hot path: what a call signature resolved to, and when torch.ops can be skipped.

See docs/en/architecture.md ("the eager hot path") and ``ops/rms_norm.py`` for the use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from greta_core import configs


class CallCache:
    """What a call signature resolved to (arch, plan, layout flags): a hit skips validation
    and planning, so an eager call pays one key build and one dict lookup.

    The key holds each tensor's dtype, device, shape and strides, the other arguments as
    they are, and ``configs.lookup`` (``greta tune`` swaps it). Only successful resolutions
    are stored, so bad input raises on every call. A key that cannot be built or hashed
    (torch.compile's symbolic sizes, a non-tensor where a tensor belongs) resolves afresh.
    """

    def __init__(self, resolve: Callable[..., Any], n_tensors: int, maxsize: int = 4096):
        self._resolve = resolve
        self._n = n_tensors
        self._maxsize = maxsize
        self._entries: dict[Any, Any] = {}

    def __call__(self, *args: Any) -> Any:
        try:
            key: tuple[Any, ...] = (configs.lookup, *args[self._n :])
            for t in args[: self._n]:
                key += (t.dtype, t.device, t.shape, t.stride()) if t is not None else (None,)
            return self._entries[key]
        except KeyError:
            value = self._resolve(*args)
            if len(self._entries) >= self._maxsize:
                self._entries.clear()
            self._entries[key] = value
            return value
        except (TypeError, AttributeError):  # unhashable (symbolic) or not a tensor
            return self._resolve(*args)

    def clear(self) -> None:
        self._entries.clear()


def eager_raw(*tensors: Any) -> bool:
    """True when a GRETA op may launch its plan directly instead of going through torch.ops.

    torch.library's custom-op dispatch costs tens of microseconds of host time per call (a
    launch-bound decode step pays it on every op). It buys autograd, tracing and dispatch
    modes; when none of them can be involved (plain GPU tensors, no gradient wanted, no
    torch.compile tracing, no torch function/dispatch mode active) the raw launcher runs the
    same kernel with the same checks. Anything else, or a torch without these hooks, takes
    the torch op.
    """
    import torch

    try:
        if (
            torch.compiler.is_compiling()
            or torch._C._len_torch_dispatch_stack()
            or torch._C._len_torch_function_stack()
        ):
            return False
    except AttributeError:
        return False
    grad = torch.is_grad_enabled()
    plain = (torch.Tensor, torch.nn.Parameter)  # subclasses (FakeTensor, DTensor...) excluded
    for t in tensors:
        if t is None:
            continue
        # is_cuda: CUDA and ROCm tensors (cheaper than building t.device.type).
        if type(t) not in plain or not t.is_cuda or (grad and t.requires_grad):
            return False
    return True
