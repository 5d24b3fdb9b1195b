"""Finding and asking the package tools (uv, pip) this machine has. Side effects only here."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from greta_install.environment.wheelfiles import Scheme
from greta_install.errors import InterpreterError


def find_uv(python: str | None = None) -> str | None:
    """The uv executable: on PATH, beside this interpreter or the target `python`, or from
    the `uv` package (what `python -m uv` runs)."""
    found = shutil.which("uv")
    if found:
        return found
    for interpreter in dict.fromkeys([sys.executable, python or sys.executable]):
        sibling = Path(interpreter).parent / "uv"
        if sibling.is_file() and os.access(sibling, os.X_OK):
            return str(sibling)
    try:
        from uv import find_uv_bin  # type: ignore[import-not-found]

        return str(find_uv_bin())
    except (ImportError, FileNotFoundError):
        return None


def has_pip(python: str) -> bool:
    try:
        proc = subprocess.run(
            [python, "-I", "-m", "pip", "--version"],
            capture_output=True,
            timeout=60,
            check=False,
            stdin=subprocess.DEVNULL,
            cwd="/",
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0


def pip_config_find_links(python: str | None = None) -> list[str]:
    """find-links locations pip is configured with (config files and PIP_FIND_LINKS).

    uv does not read pip's configuration; `greta lock` and the installer pass these on
    so a local wheel directory the machine relies on is seen by both tools.
    """
    found: list[str] = []
    env_value = os.environ.get("PIP_FIND_LINKS", "")
    found.extend(env_value.split())
    try:
        proc = subprocess.run(
            [python or sys.executable, "-I", "-m", "pip", "config", "list"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            stdin=subprocess.DEVNULL,
            cwd="/",
        )
        output = proc.stdout if proc.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        output = ""
    for line in output.splitlines():
        key, _, value = line.partition("=")
        if key.strip().endswith(".find-links"):
            found.extend(value.strip().strip("'\"").split())
    unique: list[str] = []
    for item in found:
        if item and item not in unique:
            unique.append(item)
    return unique


def _ask(python: str, code: str, what: str) -> str:
    """What `python -I -c code` prints, run isolated from a neutral directory;
    InterpreterError naming `what` when it cannot be run or fails."""
    try:
        proc = subprocess.run(
            [python, "-I", "-c", code],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            stdin=subprocess.DEVNULL,
            cwd="/",
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise InterpreterError(f"{what}: {exc}") from None
    if proc.returncode != 0:
        raise InterpreterError(f"{what}: {_said(proc.stderr, proc.returncode)}")
    if "\0" in proc.stdout:
        raise InterpreterError(f"{what}: it printed NUL bytes, not a path or a version")
    return proc.stdout


def python_version_of(python: str) -> str:
    """ "3.11" for the interpreter at `python`; ValueError when it cannot be run."""
    code = "import sys; print('%d.%d' % sys.version_info[:2])"
    version = _ask(python, code, f"cannot run Python interpreter {python}").strip()
    if not re.fullmatch(r"3\.\d{1,3}", version):
        raise InterpreterError(
            f"{python} is not a Python 3 interpreter (it printed {version[:80]!r})"
        )
    return version


def site_packages_of(python: str) -> Path:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return Path(_ask(python, code, f"cannot ask {python} for its site-packages").strip())


def scheme_of(python: str, version: str) -> Scheme:
    """Where `python` installs packages (its sysconfig scheme), asked in isolation."""
    import json

    code = "import json, sysconfig; print(json.dumps(sysconfig.get_paths()))"
    out = _ask(python, code, f"cannot ask {python} for its install paths")
    try:
        paths = json.loads(out)
        return Scheme.from_paths(paths, version)
    except (ValueError, KeyError, TypeError) as exc:
        raise InterpreterError(f"{python} answered no install paths ({exc})") from None


def _said(stderr: str, code: int) -> str:
    """The last words of a failed child, never empty."""
    text = " ".join(stderr.split())[-300:]
    return text or f"it exited with status {code} and printed nothing"
