"""The NVIDIA -> AMD library mapping, summarised from `greta_core.backends`."""

from __future__ import annotations

from greta_install.doctor.facts import Facts
from greta_install.doctor.model import Finding, fail, ok, skip, warn

from ._common import SNAPSHOT_SKIP


def check_backends(facts: Facts) -> Finding:
    """The NVIDIA -> AMD library mapping summary (`greta backends` has the details)."""
    if not facts.live:
        return skip(SNAPSHOT_SKIP)
    if facts.backends is None:
        return skip("torch did not import: no framework libraries to map")
    rank = {"ok": 0, "skip": 0, "warn": 1, "fail": 2}
    worst = max(facts.backends, key=lambda e: rank.get(e.get("status", "ok"), 0), default=None)
    text = "; ".join(e.get("finding", "") for e in facts.backends if e.get("status") != "skip")
    if worst is None or rank.get(worst.get("status", "ok"), 0) == 0:
        return ok(text or "no GPU libraries in use", entries=facts.backends)
    make = fail if worst["status"] == "fail" else warn
    return make(text, worst.get("fix") or "greta backends", entries=facts.backends)
