"""A GRETA lock as a PEP 751 `pylock.toml`, for `uv pip install -r` and other tools.

GRETA's locks (lock/targets/*.txt) pin names, versions and sha256 hashes, and name a
vendor index by URL; the package files themselves come from the index the machine is
configured with. PEP 751 needs more: each file's name and URL. So the export has two
halves: the edge asks uv to resolve the lock's exact pins against this machine's indexes
(`uv pip compile --format pylock.toml`: it reads the indexes' file lists, downloads no
wheel), and `render` (pure) keeps, per locked package, only the files whose sha256 the
lock holds, adds the vendor index and GRETA's facts, and writes the file. A file the
index offers under a hash the lock does not hold is left out; a locked package with no
file left is an error, never a silent substitute. A pin the lock holds without a hash
(a vendor file nobody could hash where the lock was made) takes the files the index offers
and is listed under `[tool.greta] unverified`, as `greta install` trusts it on first use.

The repository commits no pylock file: each names its files' URLs, and the default index's
are a registry's (the project's locks name no index but the vendors'). Each machine exports
its own row against the indexes it is configured with (`greta install --export-lock`).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from greta_install.errors import GretaError
from greta_install.locks.lockfile import Lock

LOCK_VERSION = "1.0"
RESOLVE_TIMEOUT_S = 600.0


class PylockError(GretaError):
    pass


def valid_name(path: Path) -> bool:
    """PEP 751: `pylock.toml` or `pylock.<name>.toml` (<name> without dots)."""
    from packaging.pylock import is_valid_pylock_path

    return is_valid_pylock_path(path)


def export_name(target: str, python: str, row: str = "current") -> str:
    """pylock.<target>-py<python>[-previous].toml: PEP 751 allows no dot in the middle."""
    suffix = "" if row == "current" else f"-{row}"
    return f"pylock.{target}-py{python.replace('.', '')}{suffix}.toml"


def requirements(lock: Lock) -> str:
    """The resolver's input: exactly the locked pins (hashes stay with `render`)."""
    return "".join(f"{p.name}=={p.version}\n" for p in lock.packages)


def resolve_argv(
    uv: str,
    req: Path,
    out: Path,
    python: str,
    platform: str,
    indexes: Sequence[str],
    find_links: Sequence[str],
) -> list[str]:
    argv = [
        uv, "pip", "compile", str(req), "--format", "pylock.toml", "-o", str(out),
        "--no-deps", "--no-header", "--quiet", "--python-version", python,
        "--index-strategy", "unsafe-best-match",
    ]  # fmt: skip
    if platform:
        argv += ["--python-platform", platform]
    for index in indexes:
        argv += ["--extra-index-url", index]
    for link in find_links:
        argv += ["--find-links", link]
    return argv


def resolve(
    lock: Lock,
    uv: str,
    indexes: Sequence[str],
    find_links: Sequence[str] = (),
) -> dict[str, Any]:
    """The files the machine's indexes offer for the lock's pins, as uv's pylock dict."""
    from greta_install.locks.matrix import tomllib

    with tempfile.TemporaryDirectory(prefix="greta-pylock-") as tmp:
        req = Path(tmp) / "requirements.txt"
        req.write_text(requirements(lock), encoding="utf-8")
        out = Path(tmp) / "pylock.toml"
        argv = resolve_argv(uv, req, out, lock.python, _uv_platform(lock), indexes, find_links)
        try:
            proc = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=RESOLVE_TIMEOUT_S,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise PylockError(f"uv could not be run: {exc}") from None
        if proc.returncode != 0:
            said = " ".join(proc.stderr.split())[-400:]
            raise PylockError(f"uv could not find the locked files: {said}")
        return tomllib.loads(out.read_text(encoding="utf-8"))


def vendor_indexes(lock: Lock) -> tuple[list[str], dict[str, str]]:
    """The lock's vendor indexes that answer, and why the others cannot be used. As at
    install time, a file whose index is down may come from the configured index or
    find-links, and must still carry a locked hash."""
    from greta_install.locks import vendor_index

    wanted = {p.index for p in lock.packages if p.index}
    down = vendor_index.unreachable(wanted)
    return sorted(wanted - set(down)), down


def _uv_platform(lock: Lock) -> str:
    """uv's --python-platform for the lock's platform ("x86_64-manylinux_2_28")."""
    return lock.meta.get("platform", "")


def render(lock: Lock, resolved: Mapping[str, Any], row: str = "current") -> str:
    """The pylock.toml text: the lock's pins with the resolved files whose hash it holds."""
    offered: dict[tuple[str, str], Mapping[str, Any]] = {}
    for pkg in resolved.get("packages", []):
        offered[(_canon(pkg.get("name", "")), str(pkg.get("version", "")))] = pkg
    lines = [
        "# Generated by `greta install --export-lock` from GRETA's lock "
        f"{lock.target}/py{lock.python} ({row}). PEP 751.",
        "#   uv pip install -r THIS_FILE",
        f"lock-version = {_s(LOCK_VERSION)}",
        'created-by = "greta"',
        f"requires-python = {_s(f'=={lock.python}.*')}",
        "",
    ]
    unverified = []
    for pin in sorted(lock.packages, key=lambda p: p.name):
        found = offered.get((pin.name, pin.version))
        if found is None:
            raise PylockError(f"{pin.name}=={pin.version}: no index offers it")
        locked = {h.removeprefix("sha256:") for h in pin.hashes}
        wheels = [w for w in found.get("wheels", []) if _sha(w) in locked or not locked]
        sdist = found.get("sdist")
        if sdist is not None and not (_sha(sdist) in locked or not locked):
            sdist = None
        if not wheels and sdist is None:
            raise PylockError(
                f"{pin.name}=={pin.version}: the index offers no file with a locked hash"
            )
        if not locked:
            unverified.append(pin.name)
        lines.append("[[packages]]")
        lines.append(f"name = {_s(pin.name)}")
        lines.append(f"version = {_s(pin.version)}")
        if pin.marker:
            lines.append(f"marker = {_s(pin.marker)}")
        index = found.get("index") or pin.index
        if index:
            lines.append(f"index = {_s(str(index))}")
        if sdist is not None:
            lines.append(f"sdist = {_file(sdist)}")
        if wheels:
            lines.append("wheels = [")
            lines.extend(f"  {_file(w)}," for w in wheels)
            lines.append("]")
        lines.append("")
    lines.append("[tool.greta]")
    lines.append(f"target = {_s(lock.target)}")
    lines.append(f"python = {_s(lock.python)}")
    lines.append(f"row = {_s(row)}")
    lines.append(f"platform = {_s(lock.meta.get('platform', ''))}")
    lines.append("unverified = [" + ", ".join(_s(n) for n in unverified) + "]")
    lines.append("env = {" + ", ".join(f"{k} = {_s(v)}" for k, v in lock.env.items()) + "}")
    return "\n".join(lines) + "\n"


def _file(entry: Mapping[str, Any]) -> str:
    """One wheel or sdist as an inline table: name, url, hashes (what PEP 751 needs)."""
    url = str(entry.get("url") or entry.get("path") or "")
    key = "url" if entry.get("url") else "path"
    name = entry.get("name") or urllib.parse.unquote(url.rsplit("/", 1)[-1])
    parts = [f"name = {_s(str(name))}", f"{key} = {_s(url)}"]
    if isinstance(entry.get("size"), int):
        parts.append(f"size = {entry['size']}")
    parts.append(f"hashes = {{ sha256 = {_s(_sha(entry))} }}")
    return "{ " + ", ".join(parts) + " }"


def _sha(entry: Mapping[str, Any]) -> str:
    hashes = entry.get("hashes") or {}
    return str(hashes.get("sha256", "")) if isinstance(hashes, Mapping) else ""


def _canon(name: str) -> str:
    from packaging.utils import canonicalize_name

    return canonicalize_name(name)


def _s(value: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's for these characters)."""
    return json.dumps(value, ensure_ascii=False)
