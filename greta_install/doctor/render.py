"""The doctor's report as text for people and as JSON for machines."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from greta_install.doctor.model import CheckResult, exit_code, summarize

LABELS = {"ok": "ok", "warn": "WARN", "fail": "FAIL", "skip": "skip"}


def human(results: Sequence[CheckResult], header: str, verbose: bool = False) -> str:
    width = max((len(r.id) for r in results), default=10)
    lines = [header, ""]
    for r in results:
        if r.status == "skip" and not verbose:
            continue
        lines.append(f"  {LABELS[r.status]:<4}  {r.id:<{width}}  {r.finding}")
        if r.fix and r.status != "ok":
            pad = " " * (10 + width)
            for i, fix_line in enumerate(r.fix.splitlines()):
                lines.append(f"{pad}{'fix: ' if i == 0 else '     '}{fix_line}")
    counts = summarize(results)
    hidden = "" if verbose or not counts["skip"] else " (skipped checks: greta doctor -v)"
    lines += [
        "",
        f"{counts['ok']} ok, {counts['warn']} warn, {counts['fail']} fail, {counts['skip']} skip{hidden}",
    ]
    return "\n".join(lines)


def as_json(results: Sequence[CheckResult], context: dict[str, Any]) -> dict[str, Any]:
    counts = summarize(results)
    return {
        **context,
        "checks": [r.to_json() for r in results],
        "summary": {**counts, "exit_code": exit_code(results)},
    }
