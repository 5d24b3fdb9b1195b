"""Which implementation of each op ran: observable by API and at debug log level."""

from __future__ import annotations

import logging

logger = logging.getLogger("greta")

_last: dict[str, str] = {}


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


def reset() -> None:
    """Forget what ran so far (a benchmark variant, a test): later calls record afresh."""
    _last.clear()
