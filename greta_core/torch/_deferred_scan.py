"""Registering the ops without importing torch's compiler stack.

`torch.library.triton_op` scans each op's source for the Triton kernels it launches as
soon as the op is defined, and that scan imports `torch._inductor.utils` and with it all
of `torch._dynamo` (most of `import greta_core.torch`'s time: seconds). The list it builds
is read by nothing but torch.compile's AOT-autograd cache key. While GRETA's ops register,
the scan is deferred: each op gets a list that runs the same scan the first time something
reads it, which only a compile does, by when dynamo is imported anyway.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

_LOCK = threading.Lock()


class _ScannedOnRead(list):  # type: ignore[type-arg]
    """The kernels `scan(fn)` finds, computed on the first read."""

    def __init__(self, scan: Callable[[Callable[..., Any]], list[object]], fn: Callable[..., Any]):
        super().__init__()
        self._scan: Callable[[Callable[..., Any]], list[object]] | None = scan
        self._fn = fn

    def _fill(self) -> None:
        with _LOCK:
            if self._scan is not None:
                scan, self._scan = self._scan, None
                super().extend(scan(self._fn))

    def __iter__(self) -> Iterator[object]:
        self._fill()
        return super().__iter__()

    def __len__(self) -> int:
        self._fill()
        return super().__len__()

    def __getitem__(self, index: Any) -> Any:
        self._fill()
        return super().__getitem__(index)

    def __contains__(self, item: object) -> bool:
        self._fill()
        return super().__contains__(item)

    def __eq__(self, other: object) -> bool:
        self._fill()
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        self._fill()
        return super().__repr__()


@contextlib.contextmanager
def deferred_kernel_scan() -> Iterator[None]:
    """triton_op definitions inside get their kernel list on first read. A torch without
    the scan (older releases) is left as it is."""
    try:
        from torch._library import triton as library_triton
    except ImportError:
        yield
        return
    scan = getattr(library_triton, "get_inner_triton_kernels", None)
    if scan is None:
        yield
        return
    library_triton.get_inner_triton_kernels = lambda fn: _ScannedOnRead(scan, fn)
    try:
        yield
    finally:
        library_triton.get_inner_triton_kernels = scan
