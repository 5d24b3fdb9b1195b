"""Keep Triton 3.6's CPU interpreter working with NumPy >= 2.4.

The interpreter stores scalars as one-element arrays and converts them with
``int(array)``, which NumPy 2.4 turned into an error ("only 0-dimensional arrays can be
converted to Python scalars"). Any kernel whose loop bound is a runtime value
(``for k in range(0, tl.cdiv(K, BLOCK_K))``) then fails under TRITON_INTERPRET=1. We
re-install ``__index__`` through ``.item()``, after the interpreter's own patching; on
a Triton without the problem this changes nothing.
"""

from __future__ import annotations

from typing import Any

_done = False


def ensure_patched() -> None:
    global _done
    if _done:
        return
    _done = True
    try:
        from triton.runtime import interpreter
    except ImportError:  # no Triton interpreter: nothing to fix
        return
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None:
        return

    def _index(self: Any) -> int:
        return int(self.handle.data.reshape(-1)[0])

    def patched(tensor: Any, scope: Any) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", _index)

    interpreter._patch_lang_tensor = patched
