"""Failure mode 7: ask the package index whether each locked version exists.

Uses `pip install --dry-run --no-deps` through the user's own pip configuration, so
mirrors and proxies answer exactly as they would for `greta install`. Only runs on
`greta doctor --check-index`: it needs the network.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

PIP_TIMEOUT_S = 180
_OFFLINE = (
    "Failed to establish a new connection",
    "Name or service not known",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "Could not fetch URL",
    "Connection refused",
    "timed out",
)
_MISSING = re.compile(r"No matching distribution found for (\S+)")


def pip_command(pins: Sequence[str], index: str | None) -> list[str]:
    argv = [
        sys.executable, "-I", "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed",
        "--only-binary=:all:", "--quiet", "--retries", "0", "--timeout", "20",
        "--disable-pip-version-check",
    ]  # fmt: skip
    if index:
        argv += ["--index-url", index]
    return argv + list(pins)


def classify(returncode: int, output: str) -> tuple[str, str | None]:
    """("found" | "missing" | "offline" | "error", name of the missing pin or the error line)."""
    if returncode == 0:
        return "found", None
    match = _MISSING.search(output)
    if match:
        try:
            return "missing", canonicalize_name(Requirement(match.group(1)).name)
        except InvalidRequirement:
            return "missing", canonicalize_name(match.group(1).split("=")[0])
    for marker in _OFFLINE:
        if marker in output:
            return "offline", marker
    lines = [ln for ln in output.splitlines() if ln.startswith("ERROR")]
    return "error", (lines[-1] if lines else output.strip()[-200:] or f"pip exited {returncode}")


def _run(argv: list[str]) -> tuple[int, str]:
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False,
            stdin=subprocess.DEVNULL, cwd="/",
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return 1, "pip timed out"
    except OSError as exc:
        return 1, f"ERROR: could not run pip: {exc}"
    return proc.returncode, (proc.stdout or "") + (proc.stderr or "")


def query_index(packages: Sequence[Any], run: Any = _run) -> dict[str, str]:
    """ "name==version" -> "found" | "missing" | "unknown: why", per locked package."""
    by_index: dict[str | None, list[tuple[str, str]]] = {}
    for pkg in packages:
        name = canonicalize_name(str(pkg.name))
        by_index.setdefault(getattr(pkg, "index", None), []).append((name, str(pkg.version)))
    status: dict[str, str] = {}
    for index, pins in by_index.items():
        remaining = list(pins)
        while remaining:
            returncode, output = run(pip_command([f"{n}=={v}" for n, v in remaining], index))
            verdict, what = classify(returncode, output)
            if verdict == "found":
                status.update({f"{n}=={v}": "found" for n, v in remaining})
                break
            if verdict == "missing":
                hit = [p for p in remaining if p[0] == what] or remaining[:1]
                status[f"{hit[0][0]}=={hit[0][1]}"] = "missing"
                remaining = [p for p in remaining if p != hit[0]]
                continue
            reason = f"unknown: {'offline' if verdict == 'offline' else 'pip error'} ({what})"
            status.update({f"{n}=={v}": reason for n, v in remaining})
            break
    return status
