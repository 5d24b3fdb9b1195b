"""Helpers shared by the torch op modules."""

from __future__ import annotations

from greta_core.arch import interpreter_active
from greta_core.observe import record


def use_interpreter_on_cpu() -> bool:
    """CPU tensors run the real Triton kernel only under TRITON_INTERPRET=1 (tests)."""
    return interpreter_active()


def record_reference(op: str) -> None:
    record(op, "reference-torch", "cpu")
