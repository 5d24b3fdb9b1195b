"""Issue 10's dry-run Done-when, over the whole target x Python matrix, through the CLI.

For each target of the issue and each Python its row supports (3.11, 3.12, 3.13), the dry
run is ready (exit 0, no blocker) and the kernel wheel will be present after install:
found in a source, or built here by the install's kernel-build step; the cpu row has no
kernel wheel (Triton runs in its interpreter there) and plans no build.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from greta import cli

REPO = Path(__file__).resolve().parent.parent
TARGETS = [
    ("mi300x",),
    ("radeon", "--arch", "gfx1100"),
    ("radeon", "--arch", "gfx1151"),
    ("radeon", "--arch", "gfx1103"),
    ("cuda",),
    ("cpu",),
]


@pytest.mark.parametrize("python", ["3.11", "3.12", "3.13"])
@pytest.mark.parametrize("target", TARGETS, ids=lambda t: "-".join(t[::2]))
def test_dry_run_is_ready_with_a_kernel_wheel(
    target: tuple[str, ...], python: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GRETA_KERNEL_INDEX", raising=False)  # no source: a fresh machine
    monkeypatch.chdir(REPO)
    # The CLI's own entry point in this process (a child per case cost ~0.5 CPU-s each).
    out, err = io.StringIO(), io.StringIO()
    argv = ["install", "--dry-run", "--json", "--force-target", "--python", python,
            "--target", *target]  # fmt: skip
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(argv)
    assert rc == 0, out.getvalue() + err.getvalue()
    data = json.loads(out.getvalue())
    assert data["python"]["version"] == python
    assert data["ready"] is True and data["blockers"] == []
    wheel = data["kernel_wheel"]
    steps = [step["step"] for step in data["steps"]]
    if target[0] == "cpu":
        assert wheel["status"] == "none" and "kernel-build" not in steps
        return
    arch = target[2] if len(target) > 2 else {"mi300x": "gfx942", "cuda": "sm_90"}[target[0]]
    assert wheel["arch"] == arch
    assert wheel["status"] in ("found", "build"), wheel
    assert ("kernel-build" in steps) is (wheel["status"] == "build")
