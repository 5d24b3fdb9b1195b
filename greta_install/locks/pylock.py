"""A GRETA lock as a PEP 751 `pylock.toml`, for `uv pip install -r` and other tools.

GRETA's locks (lock/targets/*.txt) pin names, versions and sha256 hashes, and name a
vendor index by URL; the package files themselves come from the index the machine is
configured with. PEP 751 needs more: each file's name and URL. So the export has two
halves: the edge asks uv to resolve the lock's exact pins against this machine's indexes
(`uv pip compile --format pylock.toml`: it reads the indexes' file lists, downloads no
wheel), and `render` (pure) keeps, per locked package, only the files whose sha256 the
lock holds, adds the vendor index and GRETA's facts, and writes the file. A file the
index offers under a hash the lock does not hold is left out; a locked package with no
file left is an error, never a silent substitute.

The committed files (lock/targets/pylock.*.toml, `greta lock`) are stricter: one file per
locked hash, each at a public URL (`gather_files`: PyPI's JSON API for default-index pins,
the vendor's page or the matrix's recorded URLs for vendor pins), so each says exactly
what its .txt lock says. They are their own record of those URLs: `stale_committed`
re-renders each from its lock and its own file list, offline.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from greta_install.errors import GretaError
from greta_install.locks.lockfile import Lock

LOCK_VERSION = "1.0"
RESOLVE_TIMEOUT_S = 600.0
# The committed pylock files name the public default index and its file host: a pylock
# must give each file's URL, and these are the ones anyone can reach (PyPI's JSON API
# lists a release's files with their sha256 and blake2b digests; the file host stores
# each file under its blake2b digest).
PUBLIC_INDEX = "https://pypi.org/simple"
PUBLIC_JSON = "https://pypi.org/pypi/{name}/json"
PUBLIC_FILES = "https://files.pythonhosted.org/packages"
COMMITTED = "greta lock --pylock"


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


def render(lock: Lock, resolved: Mapping[str, Any], row: str = "current", made_by: str = "") -> str:
    """The pylock.toml text: the lock's pins with the resolved files whose hash it holds."""
    offered: dict[tuple[str, str], Mapping[str, Any]] = {}
    for pkg in resolved.get("packages", []):
        offered[(_canon(pkg.get("name", "")), str(pkg.get("version", "")))] = pkg
    lines = [
        f"# Generated by `{made_by or 'greta install --export-lock'}` from GRETA's lock "
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


# --- the committed pylock files (lock/targets/pylock.*.toml) ---------------------------


@dataclass(frozen=True)
class KnownFile:
    """One published file: where it is and its sha256 (hex)."""

    sha256: str
    filename: str
    url: str
    size: int | None = None


def committed_name(target: str, python: str, row: str = "current") -> str:
    return export_name(target, python, row)


def public_files(name: str, version: str, document: Mapping[str, Any]) -> list[KnownFile]:
    """The files of name==version in a PyPI JSON API document, at their public URLs."""
    from packaging.version import InvalidVersion, Version

    def same(key: str) -> bool:  # the API keys a release as uploaded: 13.0.3 for 13.0.3.0
        try:
            return Version(key) == Version(version)
        except InvalidVersion:
            return False

    releases = document.get("releases", {})
    entries = [e for key in releases if same(key) for e in releases[key]]
    out = []
    for entry in entries:
        digests = entry.get("digests") or {}
        sha, blake = digests.get("sha256"), digests.get("blake2b_256")
        filename = entry.get("filename")
        if not (isinstance(sha, str) and isinstance(blake, str) and isinstance(filename, str)):
            continue
        quoted = urllib.parse.quote(filename)
        url = f"{PUBLIC_FILES}/{blake[:2]}/{blake[2:4]}/{blake[4:]}/{quoted}"
        size = entry.get("size")
        out.append(KnownFile(sha, filename, url, size if isinstance(size, int) else None))
    return out


def url_files(urls: Mapping[str, str]) -> list[KnownFile]:
    """Files the matrix records by URL ("sha256:..." -> URL), their names read from the URL."""
    return [
        KnownFile(sha.removeprefix("sha256:"), _url_filename(url), url)
        for sha, url in sorted(urls.items())
    ]


def files_in(data: Mapping[str, Any]) -> list[KnownFile]:
    """Every file a pylock document names (to re-render a committed file offline)."""
    out = []
    for pkg in data.get("packages", []):
        entries = list(pkg.get("wheels", [])) + ([pkg["sdist"]] if "sdist" in pkg else [])
        for entry in entries:
            url = str(entry.get("url", ""))
            size = entry.get("size")
            out.append(
                KnownFile(
                    _sha(entry),
                    str(entry.get("name") or _url_filename(url)),
                    url,
                    size if isinstance(size, int) else None,
                )
            )
    return out


def committed_resolved(lock: Lock, files: Iterable[KnownFile]) -> dict[str, Any]:
    """The lock's pins with one file per locked hash (uv's pylock shape, for `render`).

    Every locked hash needs its file: a pin without a hash or a hash without a known file
    is an error naming all of them, never a smaller set.
    """
    by_sha = {f.sha256: f for f in files}
    problems = []
    packages = []
    for pin in lock.packages:
        if not pin.hashes:
            problems.append(f"{pin.name}=={pin.version}: no hash is locked (unverified)")
            continue
        found = []
        for digest in pin.hashes:
            known = by_sha.get(digest.removeprefix("sha256:"))
            if known is None:
                problems.append(f"{pin.name}=={pin.version}: no known file for {digest}")
            else:
                found.append(known)
        sdists = sorted(
            (f for f in found if not f.filename.endswith(".whl")), key=lambda f: f.filename
        )
        if len(sdists) > 1:
            problems.append(f"{pin.name}=={pin.version}: {len(sdists)} source archives locked")
        wheels = sorted((f for f in found if f.filename.endswith(".whl")), key=lambda f: f.filename)
        pkg: dict[str, Any] = {
            "name": pin.name,
            "version": pin.version,
            "index": pin.index or PUBLIC_INDEX,
            "wheels": [_entry(f) for f in wheels],
        }
        if sdists:
            pkg["sdist"] = _entry(sdists[0])
        packages.append(pkg)
    if problems:
        raise PylockError("; ".join(problems))
    return {"packages": packages}


def render_committed(lock: Lock, files: Iterable[KnownFile], row: str = "current") -> str:
    return render(lock, committed_resolved(lock, files), row, made_by=COMMITTED)


def gather_files(
    lock: Lock,
    fetch_json: Callable[[str], Mapping[str, Any]],
    vendor_files: Callable[[str, str, str], list[KnownFile]],
) -> list[KnownFile]:
    """Every file the lock's pins may have: the public index's for default-index pins,
    `vendor_files(index, name, version)` (the vendor's page, the matrix's URLs) for the rest."""
    out: list[KnownFile] = []
    for pin in lock.packages:
        if pin.index:
            out += vendor_files(pin.index, pin.name, pin.version)
        else:
            out += public_files(pin.name, pin.version, fetch_json(pin.name))
    return out


def stale_committed(
    folder: Path, rows: Iterable[tuple[str, str, str]], load: Callable[[str, str, str], Lock]
) -> list[str]:
    """Offline: every lock whose pins all carry hashes has its pylock file, which parses as
    PEP 751, names exactly the lock's packages, versions and hashes, and is what
    `greta lock --pylock` writes from its own file list; a lock with an unverified pin has
    none (PEP 751 requires a hash for every file)."""
    from packaging.pylock import Pylock, PylockValidationError

    from greta_install.locks.matrix import tomllib

    problems = []
    for target, python, row in rows:
        lock = load(target, python, row).for_python(python)
        path = folder / committed_name(target, python, row)
        complete = all(p.hashes for p in lock.packages)
        if not path.is_file():
            if complete:
                problems.append(f"{path.name}: missing (run `{COMMITTED}`)")
            continue
        if not complete:
            problems.append(f"{path.name}: its lock has unverified pins; remove it")
            continue
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
            Pylock.from_dict(data)
            want = render_committed(lock, files_in(data), row)
        except (OSError, ValueError, PylockValidationError, PylockError) as exc:
            problems.append(f"{path.name}: {exc} (run `{COMMITTED}`)")
            continue
        if path.read_text(encoding="utf-8") != want:
            problems.append(f"{path.name}: differs from its lock (run `{COMMITTED}`)")
    return problems


def _entry(known: KnownFile) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": known.filename,
        "url": known.url,
        "hashes": {"sha256": known.sha256},
    }
    if known.size is not None:
        entry["size"] = known.size
    return entry


def _url_filename(url: str) -> str:
    return urllib.parse.unquote(urllib.parse.urlparse(url).path.rsplit("/", 1)[-1])
