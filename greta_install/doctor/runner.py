"""Run every check over collected facts; a check that raises becomes a result, never a crash."""

from __future__ import annotations

from collections.abc import Sequence

from greta_install.doctor.checks import CHECKS, Check
from greta_install.doctor.facts import Facts
from greta_install.doctor.model import CheckResult

BUG_FIX = "greta snapshot greta-snapshot   # and attach it to a GRETA bug report"


def run_check(check: Check, facts: Facts) -> CheckResult:
    try:
        found = check.func(facts)
        details = dict(found.details)
        if check.failure_mode is not None:
            details.setdefault("failure_mode", check.failure_mode)
        return CheckResult(check.id, check.title, found.status, found.finding, found.fix, details)
    except Exception as exc:
        # A bug in a check says nothing about the machine: report it, do not fail the run.
        return CheckResult(
            check.id,
            check.title,
            "warn",
            f"internal error in check {check.id}: {type(exc).__name__}: {exc}",
            BUG_FIX,
            {"internal_error": True},
        )


def run_checks(facts: Facts, checks: Sequence[Check] = CHECKS) -> list[CheckResult]:
    return [run_check(check, facts) for check in checks]
