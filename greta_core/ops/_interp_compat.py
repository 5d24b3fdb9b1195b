"""Work around triton-lang/triton#9171 in Triton's CPU interpreter (fixed upstream by PR
#9172, not in Triton 3.6): with NumPy >= 2.4, a loop bound that is a kernel argument or
program id (a 1-element array in the interpreter) fails with "only 0-dimensional arrays
can be converted to Python scalars". Compiled kernels are unaffected.
"""

from __future__ import annotations

import functools

from greta_core.arch import interpreter_active


@functools.cache
def apply() -> bool:
    """Patch the interpreter's tensor ``__index__`` (idempotent); True when patched."""
    if not interpreter_active():
        return False
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None:
        return False

    def patched(tensor, scope):  # type: ignore[no-untyped-def]
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched
    return True
