"""Helpers shared by the torch op modules."""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator

from greta_core.arch import interpreter_active
from greta_core.observe import record

# On CPU tensors the torch ops run the torch reference: fast, and what a CPU user wants.
# The test suite sets this (with TRITON_INTERPRET=1) so the same ops run the real Triton
# kernels through Triton's interpreter instead.
CPU_TRITON_ENV = "GRETA_TRITON_ON_CPU"

# Set by a caller whose inputs to the ops inside are its own intermediates, read by nothing
# after those ops (apply_greta's MLP and its causal-LM loss): the ops may then write
# gradients over the inputs' memory. Never for a user's tensors, which they may read later.
_CONSUME = contextvars.ContextVar("greta_consume_inputs", default=False)


@contextlib.contextmanager
def consume_inputs() -> Iterator[None]:
    """GRETA ops called inside may reuse their inputs' memory for gradients: swiglu/geglu's
    GPU backward writes dgate over gate and dup over up; linear_cross_entropy's forward on
    the Triton path writes dhidden over hidden. Writes go through torch ops, so a tensor
    some other backward saved fails autograd's version check instead of being read."""
    token = _CONSUME.set(True)
    try:
        yield
    finally:
        _CONSUME.reset(token)


def consuming() -> bool:
    """True inside :func:`consume_inputs`."""
    return _CONSUME.get()


def use_interpreter_on_cpu() -> bool:
    """CPU tensors run the real Triton kernel only when asked for and interpretable."""
    return interpreter_active() and os.environ.get(CPU_TRITON_ENV, "0") == "1"


def record_reference(op: str) -> None:
    record(op, "reference-torch", "cpu")
