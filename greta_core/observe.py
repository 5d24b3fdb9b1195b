"""Which implementation of each op ran: observable by API and at debug log level."""

from __future__ import annotations

import logging

logger = logging.getLogger("greta")

_last: dict[str, str] = {}
# Read-only view for hot paths (a ready launch): they call `record` only when the op's
# entry differs, which is what `record` would change; the dict stays observe's own.
recorded = _last
# Triton kernel name -> {"precompiled": n, "compiled": n}: where each kernel's code came
# from while a GRETA kernel wheel is installed (greta_core.kernel_wheels.precompiled).
_kernel_code: dict[str, dict[str, int]] = {}


def record(op: str, implementation: str, arch: str = "") -> None:
    """Remember (and log at debug) that `op` just ran as `implementation`."""
    if _last.get(op) != implementation:
        # Log on change only: a per-call log line would cost more than a small kernel.
        logger.debug("greta: %s -> %s%s", op, implementation, f" ({arch})" if arch else "")
    _last[op] = implementation


def last_implementation(op: str) -> str | None:
    """The implementation `op` ran with most recently in this process, or None."""
    return _last.get(op)


def implementations_seen() -> dict[str, str]:
    return dict(_last)


def record_kernel_code(kernel: str, source: str) -> None:
    """Count that a specialisation of Triton kernel `kernel` got its code from `source`:
    "precompiled" (the kernel wheel) or "compiled" (not in the wheel: the JIT compiled it on
    first use). Called once per specialisation, when Triton looks its code up."""
    counts = _kernel_code.setdefault(kernel, {"precompiled": 0, "compiled": 0})
    counts[source] += 1


def kernel_code_counts() -> dict[str, dict[str, int]]:
    """Per Triton kernel, how many specialisations came from the kernel wheel and how many
    were compiled on first use (this process, since the last `reset`)."""
    return {kernel: dict(counts) for kernel, counts in _kernel_code.items()}


def reset() -> None:
    """Forget what ran so far (a benchmark variant, a test): later calls record afresh."""
    _last.clear()
    _kernel_code.clear()
