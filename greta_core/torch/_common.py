"""Helpers shared by the torch op modules."""

from __future__ import annotations

import os

from greta_core.arch import interpreter_active
from greta_core.observe import record

# On CPU tensors the torch ops run the torch reference: fast, and what a CPU user wants.
# The test suite sets this (with TRITON_INTERPRET=1) so the same ops run the real Triton
# kernels through Triton's interpreter instead.
CPU_TRITON_ENV = "GRETA_TRITON_ON_CPU"


def use_interpreter_on_cpu() -> bool:
    """CPU tensors run the real Triton kernel only when asked for and interpretable."""
    return interpreter_active() and os.environ.get(CPU_TRITON_ENV, "0") == "1"


def record_reference(op: str) -> None:
    record(op, "reference-torch", "cpu")
