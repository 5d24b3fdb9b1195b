"""Run a framework probe in a child process with a time limit and read its JSON line."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from greta_install.doctor.facts import ProbeResult
from greta_install.doctor.probe import MARKER

STDERR_TAIL = 4000


def probe_argv(section: str) -> list[str]:
    """The command that runs probe.py's text under this interpreter.

    `-c` with the source rather than `-m greta_install.doctor.probe`: the child then needs
    neither greta on its path nor a working directory free of shadowing modules.
    """
    source = Path(__file__).with_name("probe.py").read_text(encoding="utf-8")
    return [sys.executable, "-c", source, section]


def _signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def _kill_tree(proc: subprocess.Popen[bytes]) -> None:
    # The probe runs in its own session: kill its whole process group, so helpers a
    # framework forked do not outlive the doctor.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        with contextlib.suppress(OSError):
            proc.kill()


def parse_probe_output(stdout: str) -> dict | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith(MARKER):
            try:
                data = json.loads(line[len(MARKER) :])
            except ValueError:
                return None
            return data if isinstance(data, dict) else None
    return None


def run_probe(
    argv: Sequence[str],
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> ProbeResult:
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )
    except (OSError, ValueError) as exc:
        return ProbeResult(
            "crashed", error=f"could not start the probe: {exc}", timeout_s=timeout_s
        )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_tree(proc)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            out, err = b"", b""
        return ProbeResult(
            "timeout",
            error=f"did not finish within {timeout_s:g} s and was killed",
            returncode=proc.returncode,
            stderr_tail=err.decode("utf-8", "replace")[-STDERR_TAIL:],
            seconds=time.monotonic() - start,
            timeout_s=timeout_s,
        )
    seconds = time.monotonic() - start
    stdout = out.decode("utf-8", "replace")
    stderr = err.decode("utf-8", "replace")[-STDERR_TAIL:]
    data = parse_probe_output(stdout)
    if data is not None:
        # JSON came back: the probe finished its work even if the interpreter then died
        # at exit (some GPU runtimes crash in atexit handlers); keep the code as a detail.
        return ProbeResult("ok", data, proc.returncode, None, stderr, seconds, timeout_s)
    if proc.returncode and proc.returncode < 0:
        why = f"was killed by {_signal_name(proc.returncode)}"
        outcome = "crashed"
    elif proc.returncode:
        why = f"exited with code {proc.returncode} before reporting"
        outcome = "crashed"
    else:
        why = "exited without printing its report"
        outcome = "garbled"
    return ProbeResult(outcome, {}, proc.returncode, why, stderr, seconds, timeout_s)  # type: ignore[arg-type]
