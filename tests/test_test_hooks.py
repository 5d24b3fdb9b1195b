"""Test hooks are inert unless the harness arms them (issue 30 item 6).

`GRETA_TEST_CHECKPOINT=installer` + `..._WAIT=100000` in a lock's `# greta-env:` lines made
every later `greta install` of that environment hang. Now a hook is armed only by a hooks
file (`GRETA_TEST_HOOKS` names it): a regular file of this user, not writable by others,
holding `{"greta_test_hooks": 1, ...}`. A lock or env file can set variables only (and the
allowlist refuses GRETA_TEST_* and path values), never create that file.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from _install_helpers import REPO, arm_checkpoint

from greta_install.environment import envfix
from greta_install.install import pipeline
from greta_install.locks.lockfile import LockError, parse_lock

LOCK = (REPO / "lock" / "targets" / "cpu-py311.txt").read_text()
LINE = "# greta-env: TRITON_INTERPRET=1"
OLD_HOOK = {
    "GRETA_TEST_CHECKPOINT": "installer",
    "GRETA_TEST_CHECKPOINT_WAIT": "100000",
    "GRETA_TEST_CHECKPOINT_RELEASE": "/nonexistent",
}


def _timed_checkpoint(capsys: pytest.CaptureFixture[str]) -> tuple[float, str]:
    start = time.monotonic()
    pipeline._checkpoint("installer")
    return time.monotonic() - start, capsys.readouterr().err


def test_the_old_variables_alone_arm_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, value in OLD_HOOK.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv(pipeline.HOOKS_ENV, raising=False)
    seconds, err = _timed_checkpoint(capsys)
    assert err == "" and seconds < 5  # returned at once; a live hook would wait 100000 s


def test_an_armed_hooks_file_announces_and_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    release = tmp_path / "release"
    release.touch()  # released at once: the hook announces, then goes on
    for name, value in arm_checkpoint(tmp_path, "installer", 60, release).items():
        monkeypatch.setenv(name, value)
    _, err = _timed_checkpoint(capsys)
    assert err == "greta-checkpoint: installer\n"
    pipeline._checkpoint("finish")  # another point than the armed one: nothing said
    assert capsys.readouterr().err == ""


def _hooks_file(tmp_path: Path, content: object, mode: int = 0o600) -> Path:
    path = tmp_path / "hooks.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    os.chmod(path, mode)
    return path


VALID = {"greta_test_hooks": 1, "checkpoint": "installer", "wait": 100000}


@pytest.mark.parametrize(
    "case",
    ["relative", "missing", "group-writable", "world-writable", "symlink", "fifo", "directory",
     "env-file-content", "wrong-key", "not-json", "too-big", "list"],
)  # fmt: skip
def test_anything_but_the_harness_file_arms_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    monkeypatch.chdir(tmp_path)
    path: Path | str
    if case == "relative":
        _hooks_file(tmp_path, VALID)
        path = "hooks.json"
    elif case == "missing":
        path = tmp_path / "absent.json"
    elif case == "group-writable":
        path = _hooks_file(tmp_path, VALID, 0o620)
    elif case == "world-writable":
        path = _hooks_file(tmp_path, VALID, 0o602)
    elif case == "symlink":  # a link to a valid file: O_NOFOLLOW refuses it
        path = tmp_path / "link.json"
        path.symlink_to(_hooks_file(tmp_path, VALID))
    elif case == "fifo":  # never blocks
        path = tmp_path / "fifo"
        os.mkfifo(path)
    elif case == "directory":
        path = tmp_path
    elif case == "env-file-content":  # what GRETA itself writes (greta-env.json)
        path = _hooks_file(tmp_path, {"schema": 1, "env": {"GRETA_TEST_CHECKPOINT": "installer"}})
    elif case == "wrong-key":
        path = _hooks_file(tmp_path, {**VALID, "greta_test_hooks": True})
    elif case == "not-json":
        path = _hooks_file(tmp_path, "greta_test_hooks=1")
    elif case == "too-big":
        path = _hooks_file(tmp_path, {**VALID, "pad": "x" * 5000})
    else:
        path = _hooks_file(tmp_path, [VALID])
    monkeypatch.setenv(pipeline.HOOKS_ENV, str(path))
    assert pipeline.armed_test_hooks() == {}
    # The control: the same content in a proper file arms it.
    (tmp_path / "ok").mkdir()
    good = _hooks_file(tmp_path / "ok", VALID)
    monkeypatch.setenv(pipeline.HOOKS_ENV, str(good))
    assert pipeline.armed_test_hooks() == VALID


def test_a_lock_or_env_file_cannot_name_the_hooks_file(tmp_path: Path) -> None:
    hooks = _hooks_file(tmp_path, VALID)
    with pytest.raises(LockError, match=f"may not set {pipeline.HOOKS_ENV}"):
        parse_lock(LOCK.replace(LINE, f"# greta-env: {pipeline.HOOKS_ENV}={hooks}", 1))
    with pytest.raises(envfix.EnvFixError):
        envfix.validate_env({pipeline.HOOKS_ENV: str(hooks)})
    # A hand-written greta-env.json naming it: refused by `greta env`, never applied by the
    # start-up hook (test_env_allowlist's harness runs the hook file itself).
    site = tmp_path / "site"
    site.mkdir()
    envfix.write_env_fixes(site, {"TRITON_INTERPRET": "1"})
    (site / envfix.JSON_NAME).write_text(
        json.dumps({"schema": 1, "env": {pipeline.HOOKS_ENV: str(hooks), **OLD_HOOK}})
    )
    with pytest.raises(envfix.EnvFixError):
        envfix.read_env_fixes(site)
    from test_env_allowlist import _applied

    assert _applied(site, pipeline.HOOKS_ENV) == "None"
    assert _applied(site, "GRETA_TEST_CHECKPOINT") == "None"
