"""torch.compile's Inductor copies each user Triton kernel's source (and the @triton.jit
functions it calls) into a triple-quoted string of the module it generates: an escape
sequence in a kernel's source ("\\n" in an inline-asm string) becomes the character itself
there, and the generated module no longer parses (seen on an H100: every compiled norm
backward failed). No kernel source holds a backslash."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

pytest.importorskip("triton")

from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

import greta_core.kernels


def _jit_sources() -> dict[str, str]:
    """Each @triton.jit function's source (a JITFunction, or the interpreter's stand-in:
    both keep the Python function as ``fn``)."""
    found = {}
    for info in pkgutil.iter_modules(greta_core.kernels.__path__):
        module = importlib.import_module(f"greta_core.kernels.{info.name}")
        for name, value in vars(module).items():
            fn = getattr(value, "fn", None)
            jit = isinstance(value, (JITFunction, InterpretedFunction))
            if jit and inspect.isfunction(fn) and fn.__module__ == module.__name__:
                found[f"{info.name}.{name}"] = inspect.getsource(fn)
    return found


def test_every_kernel_source_copies_into_a_string_unchanged() -> None:
    sources = _jit_sources()
    assert len(sources) > 20  # every kernel module was read
    with_escapes = [name for name, src in sources.items() if "\\" in src]
    assert with_escapes == []
