"""Messages that said the wrong thing (issue 30 item 9), each from its repro, with variants.
(Relative --python: tests/test_children_isolated.py; a lock value over 4096 characters:
tests/test_env_allowlist.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from _install_helpers import REPO

from greta_install.install import hashrecord, installer


def _greta(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "greta", *args], cwd=REPO, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("value", ["-5", "0", "nan", "inf", "-inf", "-1e9", "x"])
def test_smoke_refuses_a_timeout_that_is_no_positive_number(value: str) -> None:
    """`--timeout -5` ran the smoke test and said it did not finish in time."""
    proc = _greta("smoke", f"--timeout={value}")
    assert proc.returncode == 2
    assert "argument --timeout: invalid positive_seconds value" in proc.stderr
    assert "did not finish" not in proc.stdout + proc.stderr


def test_from_record_names_what_the_path_is(tmp_path: Path) -> None:
    """`--from-record /dev/zero` said "no such file"."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (Path("/dev/zero"), fifo, tmp_path):
        with pytest.raises(hashrecord.HashRecordError, match="not a regular file"):
            hashrecord.known_record(None, path)
    with pytest.raises(hashrecord.HashRecordError, match="no such file"):
        hashrecord.known_record(None, tmp_path / "absent")


@pytest.mark.parametrize(
    "stderr",
    [
        "ERROR: Exception:\nTraceback (most recent call last):\n  ...\n"
        "OSError: [Errno 28] No space left on device",
        "ERROR: Could not install packages due to an OSError: [Errno 122] Disk quota exceeded",
    ],
)
def test_a_full_staging_disk_is_said_as_such(stderr: str) -> None:
    """A full staging tmpfs gave "download failed: ERROR: Exception:"."""
    reason = installer._reason(stderr)
    assert reason.startswith("the staging folder's disk is full (set TMPDIR")
