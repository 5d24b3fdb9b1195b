"""`greta lock`: turn matrix rows into complete, hashed lock files.

Default-index packages (and the dependencies recorded for vendor pins) are resolved by
`uv pip compile --generate-hashes` for the row's Python and platform, with
`--exclude-newer` from the matrix so a re-run gives the same answer. Vendor pins keep
their matrix version; their hash comes from the vendor's simple index when it answers,
else from a local copy of the exact wheel (pip's find-links), else the pin is recorded
as unverified.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import Version

from greta_install import kernel_names
from greta_install.errors import GretaError
from greta_install.locks.lockfile import (
    Lock,
    LockedPackage,
    LockError,
    format_lock,
    lock_filename,
    parse_lock,
)
from greta_install.locks.matrix import Matrix, Pin, Row, TargetSpec

FORMAT_VERSION = "1"
UV_TIMEOUT_S = 600
INDEX_TIMEOUT_S = 15


# Kept importable from here (other installer modules used these names); the rule itself
# lives in greta_install.kernel_names.
kernel_wheel_name = kernel_names.distribution_name
kernel_wheel_requirement = kernel_names.requirement


class LockGenError(GretaError):
    """A row could not be resolved; the message says which and why."""


@dataclass(frozen=True)
class VendorHash:
    hashes: tuple[str, ...]
    how: str  # "vendor index", "local copy", or why it is unverified


def greta_version() -> str:
    from greta_install.version import __version__

    return __version__


Filled = Mapping[tuple[str, str, str], tuple[str, ...]]  # (name, version, python) -> hashes


def fingerprint(
    row: Row, spec: TargetSpec, matrix: Matrix, version: str, filled: Filled | None = None
) -> str:
    """Digest of everything in the matrix that shapes this row's lock file (not the prose)."""
    names = {p.name for p in concrete_pins(row, spec)}
    data = {
        "filled": sorted(
            [
                list(k) + list(v)
                for k, v in (filled or {}).items()
                if k[0] in names and k[2] in (row.python, "any")
            ]
        ),
        "format": FORMAT_VERSION,
        "python": row.python,
        "generation": row.generation,
        "archs": list(spec.archs) if any(p.per_arch for p in row.pins) else [],
        "platform": matrix.platform,
        "exclude_newer": matrix.exclude_newer,
        "env": dict(sorted(spec.env.items())),
        "kernel_wheel": kernel_names.requirement(spec.default_arch, version)
        if spec.kernel_wheel and spec.default_arch
        else None,
        "pins": sorted(
            [
                {
                    "name": p.name,
                    "version": p.version,
                    "index": p.index,
                    "extras": list(p.extras),
                    "requires": list(p.requires),
                    "provides": list(p.provides),
                    "hashes": {k: list(v) for k, v in sorted(p.hashes.items())},
                    "per_arch": p.per_arch,
                    "sdist": p.sdist,
                }
                for p in row.pins
            ],
            key=lambda d: str(d["name"]),
        ),
    }
    blob = json.dumps(data, sort_keys=True).encode()
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def resolver_input(row: Row) -> tuple[list[str], list[str]]:
    """(requirements for the default-index resolver, names it must not emit)."""
    vendor = {p.name for p in row.pins if p.index}
    provided = {prov: p for p in row.pins for prov in p.provides}
    lines: list[str] = []
    for pin in row.pins:
        if pin.index is None:
            lines.append(pin.requirement)
            continue
        for text in pin.requires:
            req = Requirement(text)
            name = canonicalize_name(req.name)
            if name in vendor or name in provided:
                continue
            req.marker = None  # the row is resolved for one platform
            lines.append(str(req))
    # Dependencies on a distribution a vendor pin stands in for (jax-triton -> triton on
    # ROCm) resolve against the provider's version and are left out of the lock.
    no_emit = []
    for name, pin in sorted(provided.items()):
        # The vendor's +local build stands in for the public release of that version.
        lines.append(f"{name}=={Version(pin.version).public}")
        no_emit.append(name)
    return lines, no_emit


def resolve_default_index(
    requirements: Sequence[str],
    no_emit: Sequence[str],
    python: str,
    matrix: Matrix,
    uv: str,
) -> list[LockedPackage]:
    argv = [
        uv,
        "pip",
        "compile",
        "-",
        "--generate-hashes",
        "--python-version",
        python,
        "--python-platform",
        matrix.platform,
        "--only-binary",
        ":all:",
        "--exclude-newer",
        matrix.exclude_newer,
        "--no-header",
        "--no-annotate",
        "--no-python-downloads",
        "--quiet",
    ]
    for name in no_emit:
        argv += ["--no-emit-package", name]
    env = dict(os.environ, UV_PYTHON_DOWNLOADS="never", NO_COLOR="1")
    try:
        proc = subprocess.run(
            argv,
            input="\n".join(requirements) + "\n",
            capture_output=True,
            text=True,
            timeout=UV_TIMEOUT_S,
            check=False,
            env=env,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise LockGenError(f"could not run uv: {exc}") from None
    if proc.returncode != 0:
        raise LockGenError(f"uv could not resolve the row:\n{proc.stderr.strip()[-2000:]}")
    header = "# greta-target: x\n# greta-python: x\n"
    try:
        parsed = parse_lock(header + proc.stdout, origin="uv output")
    except LockError as exc:
        raise LockGenError(f"unexpected uv output: {exc}") from None
    return list(parsed.packages)


# --- vendor hashes ----------------------------------------------------------------------


def target_tags(python: str, platform: str) -> set[Tag]:
    """Wheel tags a CPython `python` on `platform` (e.g. x86_64-manylinux_2_28) accepts."""
    major, minor = (int(x) for x in python.split("."))
    arch, _, libc = platform.partition("-")
    platforms = [f"linux_{arch}"]
    if libc.startswith("manylinux_"):
        glibc_minor = int(libc.split("_")[2])
        platforms = [f"manylinux_2_{m}_{arch}" for m in range(glibc_minor, 16, -1)]
        platforms += [
            f"manylinux2014_{arch}",
            f"manylinux2010_{arch}",
            f"manylinux1_{arch}",
            f"linux_{arch}",
        ]
    tags = set(cpython_tags((major, minor), platforms=platforms))
    tags |= set(
        compatible_tags((major, minor), interpreter=f"cp{major}{minor}", platforms=platforms)
    )
    return tags


def matching_wheel(filename: str, name: str, version: str, tags: set[Tag] | None) -> bool:
    """A wheel for these tags (any, for None), or a source archive, of exactly name==version."""
    if filename.endswith(".tar.gz"):
        try:
            dist, sdist_version = parse_sdist_filename(filename)
        except InvalidSdistFilename:
            return False
        return dist == canonicalize_name(name) and sdist_version == Version(version)
    try:
        dist, wheel_version, _build, wheel_tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return False
    return (
        dist == canonicalize_name(name)
        and wheel_version == Version(version)
        and (tags is None or bool(wheel_tags & tags))
    )


class IndexLinks(HTMLParser):
    """The href of every <a> in a PEP 503 simple-index page (its `links`)."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            href = dict(attrs).get("href")
            if href:
                self.links.append(href)


def hashes_from_simple_index(
    index: str, pin: Pin, tags: set[Tag], fetch: Callable[[str], str] | None = None
) -> tuple[str, ...]:
    """sha256 fragments of the matching wheels on a PEP 503 page; OSError when unreachable."""
    url = f"{index.rstrip('/')}/{pin.name}/"
    if fetch is None:

        def fetch(u: str) -> str:
            with urllib.request.urlopen(u, timeout=INDEX_TIMEOUT_S) as response:
                return response.read().decode("utf-8", errors="replace")

    parser = IndexLinks()
    parser.feed(fetch(url))
    found = []
    for href in parser.links:
        parsed = urllib.parse.urlparse(href)
        filename = urllib.parse.unquote(parsed.path.rsplit("/", 1)[-1])
        fragment = parsed.fragment
        if fragment.startswith("sha256=") and matching_wheel(filename, pin.name, pin.version, tags):
            found.append("sha256:" + fragment.split("=", 1)[1].lower())
    return tuple(sorted(set(found)))


def hashes_from_find_links(dirs: Sequence[str], pin: Pin, tags: set[Tag]) -> tuple[str, ...]:
    found = []
    for entry in dirs:
        path = Path(entry[len("file://") :] if entry.startswith("file://") else entry)
        if not path.is_dir():
            continue
        for wheel in sorted(path.glob("*.whl")):
            if matching_wheel(wheel.name, pin.name, pin.version, tags):
                found.append("sha256:" + sha256_file(wheel))
    return tuple(sorted(set(found)))


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def attested_hashes(pin: Pin, python: str) -> tuple[str, ...]:
    """Hashes the matrix records from public records for this Python (or any)."""
    return tuple(pin.hashes.get(python, ())) + tuple(pin.hashes.get("any", ()))


def vendor_hash(
    pin: Pin,
    python: str,
    platform: str,
    find_links: Sequence[str],
    fetch: Callable[[str], str] | None = None,
    filled: Filled | None = None,
) -> VendorHash:
    """The sha256 of a vendor pin: from its index, a local copy, or public records.

    When the index answers and the matrix also records an attested hash, both must
    agree: a vendor that re-uploads a file under the same name is caught here.
    """
    assert pin.index is not None
    tags = target_tags(python, platform)
    attested = attested_hashes(pin, python) + tuple(
        h for py in (python, "any") for h in (filled or {}).get((pin.name, pin.version, py), ())
    )
    try:
        hashes = hashes_from_simple_index(pin.index, pin, tags, fetch)
        if hashes:
            if attested and not set(attested) & set(hashes):
                raise LockGenError(
                    f"{pin.name}=={pin.version}: the vendor index lists {', '.join(hashes)} but "
                    f"public records attest {', '.join(attested)} ({pin.hash_source})"
                )
            return VendorHash(hashes, "hash read from the vendor index")
        reason = "the vendor index lists no matching file with a hash"
    except (OSError, urllib.error.URLError, ValueError) as exc:
        reason = f"vendor index unreachable ({exc.__class__.__name__})"
    hashes = hashes_from_find_links(find_links, pin, tags)
    if hashes:
        return VendorHash(hashes, f"hash of a local copy of the vendor's file ({reason})")
    if attested:
        how = (
            "attested by public records"
            if attested_hashes(pin, python)
            else "filled by `greta lock --fill-hashes`"
        )
        return VendorHash(attested, f"hash {how} ({reason})")
    return VendorHash((), reason)


# --- whole rows -------------------------------------------------------------------------


@dataclass(frozen=True)
class Generated:
    lock: Lock
    text: str
    unverified: tuple[str, ...]


def concrete_pins(row: Row, spec: TargetSpec) -> list[Pin]:
    """The row's pins with every per-arch pin expanded over the target's archs."""
    out: list[Pin] = []
    for pin in row.pins:
        if not pin.per_arch:
            out.append(pin)
            continue
        for arch in spec.archs:
            out.append(dataclasses.replace(pin, name=pin.for_arch(arch), per_arch=False))
    return out


def generate_row(
    matrix: Matrix,
    target: str,
    python: str,
    uv: str,
    find_links: Sequence[str] = (),
    version: str | None = None,
    generation: str = "current",
    fetch: Callable[[str], str] | None = None,
    resolve: Callable[..., list[LockedPackage]] | None = None,
    filled: Filled | None = None,
) -> Generated:
    """One lock file. `fetch` and `resolve` are the network edges (tests pass fakes)."""
    version = version or greta_version()
    spec = matrix.target(target)
    row = matrix.row(target, python, generation)
    requirements, no_emit = resolver_input(row)
    resolved = (resolve or resolve_default_index)(requirements, no_emit, python, matrix, uv)
    packages = {p.name: p for p in resolved}
    notes: dict[str, str] = {}
    pins = concrete_pins(row, spec)
    for pin in pins:
        if pin.index is None:
            continue
        found = vendor_hash(pin, python, matrix.platform, find_links, fetch, filled)
        packages[pin.name] = LockedPackage(pin.name, pin.version, pin.index, found.hashes, None)
        source = (
            f"; {pin.hash_source}"
            if found.hashes and pin.hash_source and "attested" in found.how
            else ""
        )
        notes[pin.name] = f"greta: {found.how}{source}"
    for pin in pins:
        if pin.name not in packages:
            raise LockGenError(f"{target}/py{python}: the resolver dropped {pin.name}")
        if packages[pin.name].version != pin.version:
            raise LockGenError(
                f"{target}/py{python}: resolved {pin.name}=={packages[pin.name].version}, matrix pins {pin.version}"
            )
    kernel = (
        kernel_names.requirement(spec.default_arch, version)
        if spec.kernel_wheel and spec.default_arch
        else None
    )
    meta = {
        "target": target,
        "python": python,
        "row": generation,
        "platform": matrix.platform,
        "exclude-newer": matrix.exclude_newer,
        "input": fingerprint(row, spec, matrix, version, filled),
    }
    per_arch = sorted(p.name for p in row.pins if p.per_arch)
    if per_arch:
        # The install keeps only the GPU's own device package of these.
        meta["per-arch"] = ",".join(per_arch)
    sdists = sorted(p.name for p in row.pins if p.sdist)
    if sdists:
        meta["sdist"] = ",".join(sdists)
    lock = Lock(
        target=target,
        python=python,
        packages=tuple(sorted(packages.values(), key=lambda p: p.name)),
        kernel_wheel=kernel,
        env=dict(spec.env),
        meta=meta,
    )
    text = format_lock(lock, notes)
    unverified = tuple(p.name for p in lock.packages if not p.verified)
    return Generated(lock, text, unverified)


def stale_locks(
    matrix: Matrix, folder: Path, version: str | None = None, filled: Filled | None = None
) -> list[str]:
    """Lock files that are missing or were made from a different matrix row (offline check)."""
    version = version or greta_version()
    problems = []
    for row in matrix.rows():
        path = folder / lock_filename(row.target, row.python, row.generation)
        if not path.is_file():
            problems.append(f"{path.name}: missing")
            continue
        try:
            lock = parse_lock(path.read_text(encoding="utf-8"), row.target, row.python, path.name)
        except LockError as exc:
            problems.append(str(exc))
            continue
        want = fingerprint(row, matrix.target(row.target), matrix, version, filled)
        if lock.meta.get("input") != want:
            problems.append(f"{path.name}: made from an older matrix row (re-run `greta lock`)")
    return problems


# --- filling missing vendor hashes (maintainers, on a connected machine) --------------------

HASHES_FILE = "hashes.toml"


@dataclass(frozen=True)
class FilledHash:
    name: str
    version: str
    python: str  # "3.12", or "any" for a source archive
    filename: str
    sha256: str  # "sha256:<hex>"
    url: str


def _vendor_links(pin: Pin, fetch: Callable[[str], str]) -> list[tuple[str, str, str | None]]:
    """(filename, absolute url, sha256 fragment or None) of every file on the pin's page."""
    assert pin.index is not None
    page = f"{pin.index.rstrip('/')}/{pin.name}/"
    parser = IndexLinks()
    parser.feed(fetch(page))
    out = []
    for href in parser.links:
        url = urllib.parse.urljoin(page, href)
        parsed = urllib.parse.urlparse(url)
        filename = urllib.parse.unquote(parsed.path.rsplit("/", 1)[-1])
        frag = parsed.fragment
        sha = frag.split("=", 1)[1].lower() if frag.startswith("sha256=") else None
        out.append((filename, url.split("#", 1)[0], sha))
    return out


def fill_hashes(
    matrix: Matrix,
    pythons: Sequence[str],
    fetch: Callable[[str], str],
    download_sha256: Callable[[str], str],
    log: Callable[[str], None] = lambda _m: None,
) -> list[FilledHash]:
    """The sha256 of every vendor file the matrix pins without one.

    The index's own `#sha256=` fragment is used when it has one; otherwise the file is
    downloaded and hashed (`download_sha256(url)` streams it). Pins that already carry
    an attested hash are checked, not skipped: a mismatch raises LockGenError.
    """
    found: dict[tuple[str, str, str, str], FilledHash] = {}
    for row in matrix.rows():
        if row.python not in pythons:
            continue
        spec = matrix.target(row.target)
        tags = target_tags(row.python, matrix.platform)
        for pin in concrete_pins(row, spec):
            if pin.index is None:
                continue
            try:
                links = _vendor_links(pin, fetch)
            except (OSError, urllib.error.URLError, ValueError) as exc:
                raise LockGenError(
                    f"{pin.name}: vendor index {pin.index} unreachable: {exc}"
                ) from None
            for filename, url, sha in links:
                if not matching_wheel(filename, pin.name, pin.version, tags):
                    continue
                key_py = "any" if filename.endswith(".tar.gz") else row.python
                key = (pin.name, pin.version, key_py, filename)
                if key in found:
                    continue
                if sha is None:
                    log(f"downloading {filename} to hash it (the index publishes no sha256)")
                    sha = download_sha256(url)
                digest = f"sha256:{sha}"
                attested = attested_hashes(pin, row.python)
                if attested and digest not in attested and key_py in pin.hashes:
                    raise LockGenError(
                        f"{filename}: the vendor serves {digest} but public records attest "
                        f"{', '.join(attested)} ({pin.hash_source})"
                    )
                found[key] = FilledHash(pin.name, pin.version, key_py, filename, digest, url)
    return sorted(found.values(), key=lambda f: (f.name, f.version, f.python, f.filename))


def format_hashes_file(filled: Sequence[FilledHash], when: str) -> str:
    """lock/hashes.toml: machine-written hashes that `load_matrix` adds to the pins."""
    lines = [
        "# Written by `greta lock --fill-hashes` on a machine that reached the vendor indexes.",
        "# Each entry: the exact file, where it came from and its sha256. Do not edit by hand.",
        f'filled = "{when}"',
        "",
    ]
    for f in filled:
        lines += [
            "[[file]]",
            f'name = "{f.name}"',
            f'version = "{f.version}"',
            f'python = "{f.python}"',
            f'filename = "{f.filename}"',
            f'url = "{f.url}"',
            f'sha256 = "{f.sha256}"',
            "",
        ]
    return "\n".join(lines)


def download_sha256(url: str, timeout: float = INDEX_TIMEOUT_S) -> str:
    digest = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=timeout) as response:
        for block in iter(lambda: response.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_filled(path: Path) -> dict[tuple[str, str, str], tuple[str, ...]]:
    """The hashes in lock/hashes.toml ({} when there is none)."""
    import tomllib

    if not path.is_file():
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise LockGenError(f"{path.name} is unreadable: {exc}") from None
    out: dict[tuple[str, str, str], tuple[str, ...]] = {}
    for entry in data.get("file", []):
        try:
            key = (canonicalize_name(entry["name"]), entry["version"], entry["python"])
            sha = entry["sha256"]
        except (KeyError, TypeError):
            raise LockGenError(f"{path.name}: an entry lacks name/version/python/sha256") from None
        if not isinstance(sha, str) or not sha.startswith("sha256:") or len(sha) != 71:
            raise LockGenError(f"{path.name}: {key[0]}: malformed sha256 {sha!r}")
        out[key] = tuple(sorted({*out.get(key, ()), sha}))
    return out
