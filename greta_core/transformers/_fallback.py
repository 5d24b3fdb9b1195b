"""Where GRETA hands a call back to the model's own code: said once, and observable."""

from __future__ import annotations

import warnings

import torch

from greta_core.observe import record


class GretaFallbackWarning(UserWarning):
    """A patched module ran its non-GRETA path (the message says why)."""


_warned: set[tuple[str, str]] = set()


def fall_back(op: str, implementation: str, reason: str) -> None:
    """Record that `op` ran as `implementation` and warn once per (op, reason).

    Skipped while torch.compile traces: the decision is static there, and the eager
    calls before and after compilation already report it.
    """
    if torch.compiler.is_compiling():
        return
    record(op, implementation)
    if (op, reason) not in _warned:
        _warned.add((op, reason))
        warnings.warn(
            f"greta: {op} runs as {implementation}: {reason}",
            GretaFallbackWarning,
            stacklevel=3,
        )
