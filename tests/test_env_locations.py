"""URLs and paths from variables and options are checked in one place (issue 30 item 7):
control characters in GRETA_KERNEL_INDEX gave `http.client.InvalidURL` with a traceback,
or slipped on as a path; now a one-line refusal naming the variable, before anything runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from _install_helpers import REPO

from greta_core.kernel_wheels.cache import cache_root as runtime_cache_root
from greta_install import commandline
from greta_install.install import hashrecord, kernel_build

# Values are built from relative names and the loopback address: no path of a machine.
BAD = ["http://127.0.0.1:9/\nsimple", "http://127.0.0.1:9/x\x01y", "wheels\x7f", "\ttab"]
# Each case of the one rule is checked in-process; two of them end to end.
END_TO_END = BAD[:2]


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRETA_")}
    return {**env, **extra}


@pytest.mark.parametrize("value", END_TO_END)
def test_a_control_character_in_the_kernel_index_is_one_line(value: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "greta", "install", "--dry-run", "--target", "mi300x"],
        cwd=REPO, env=_clean_env(GRETA_KERNEL_INDEX=value), capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "GRETA_KERNEL_INDEX holds a control character" in lines[0]


def test_the_option_is_held_to_the_same_rule() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "greta", "install", "--dry-run", "--target", "mi300x",
         "--kernel-wheels", "http://127.0.0.1:9/\x1bsimple"],
        cwd=REPO, env=_clean_env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--kernel-wheels holds a control character" in proc.stderr


@pytest.mark.parametrize(
    ("name", "read", "error"),
    [
        ("GRETA_KERNEL_CACHE", kernel_build.cache_root, kernel_build.KernelBuildError),
        ("GRETA_HASH_RECORD", hashrecord.user_record_path, hashrecord.HashRecordError),
        ("GRETA_CACHE_DIR", runtime_cache_root, commandline.LocationError),
    ],
)
def test_other_path_variables_are_held_to_it(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    name: str,
    read: object,
    error: type[Exception],
) -> None:
    monkeypatch.setenv(name, f"{tmp_path}/cache\nelsewhere")
    with pytest.raises(error, match=f"{name} holds a control character"):
        read()  # type: ignore[operator]
    monkeypatch.setenv(name, f"{tmp_path}/" + "x" * commandline.LOCATION_MAX_CHARS)
    with pytest.raises(error, match="over the 4096-character limit"):
        read()  # type: ignore[operator]
    monkeypatch.setenv(name, f"{tmp_path}/fine")
    assert str(read()).startswith(f"{tmp_path}/fine")  # type: ignore[operator]


@pytest.mark.parametrize("value", BAD)
def test_each_control_character_is_refused_by_the_one_rule(value: str) -> None:
    with pytest.raises(commandline.LocationError, match="GRETA_KERNEL_INDEX holds a control"):
        commandline.env_location("GRETA_KERNEL_INDEX", {"GRETA_KERNEL_INDEX": value})


def test_plain_values_pass_unchanged(tmp_path: Path) -> None:
    for value in ("http://127.0.0.1:9/simple", str(tmp_path), tmp_path.as_uri(), "rel/dir"):
        assert commandline.location(value, "X") == value
    assert commandline.env_location("X", {}) is None
    assert commandline.env_location("X", {"X": ""}) is None


@pytest.mark.parametrize("name", ["a" * 120_000, "snap\nshot"], ids=["120KB", "newline"])
def test_a_snapshot_name_no_path_can_be_is_one_short_line(tmp_path: Path, name: str) -> None:
    """Issue 30 item 7: a 120 KB snapshot name; the refusal echoed it whole."""
    proc = subprocess.run(
        [sys.executable, "-m", "greta", "snapshot", name], cwd=tmp_path, env=_clean_env(
            PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and len(lines[0]) < 200 and lines[0].startswith("greta snapshot: DIR ")
    assert list(tmp_path.iterdir()) == []  # nothing written
