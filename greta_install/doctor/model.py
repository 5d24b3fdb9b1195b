"""Result of one doctor check, and how a list of them becomes a summary and an exit code."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["ok", "warn", "fail", "skip"]
STATUSES: tuple[Status, ...] = ("ok", "warn", "fail", "skip")


@dataclass(frozen=True)
class CheckResult:
    """One line of the doctor's report.

    `fix` is what the user types (a command, an export, a pip line); it is None only
    when the status is ok or skip, or when no action of the user can help.
    """

    id: str
    title: str
    status: Status
    finding: str
    fix: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "status": self.status,
            "finding": self.finding,
            "fix": self.fix,
            "details": self.details,
        }


def summarize(results: Iterable[CheckResult]) -> dict[str, int]:
    counts = {status: 0 for status in STATUSES}
    for result in results:
        counts[result.status] = counts.get(result.status, 0) + 1
    return counts


def exit_code(results: Iterable[CheckResult]) -> int:
    """0 when nothing fails, 1 otherwise (warnings never change the exit code)."""
    return 1 if any(r.status == "fail" for r in results) else 0


@dataclass(frozen=True)
class Finding:
    """What a check function returns; the runner adds the check's id and title."""

    status: Status
    finding: str
    fix: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


def ok(finding: str, **details: Any) -> Finding:
    return Finding("ok", finding, None, details)


def warn(finding: str, fix: str | None, **details: Any) -> Finding:
    return Finding("warn", finding, fix, details)


def fail(finding: str, fix: str | None, **details: Any) -> Finding:
    return Finding("fail", finding, fix, details)


def skip(finding: str, **details: Any) -> Finding:
    return Finding("skip", finding, None, details)
