"""Trust-on-first-use record of the sha256 of files the lock could not hash.

Some vendor files have no hash anywhere GRETA can read (AMD's index publishes none,
PyTorch's none for its triton wheels). The first install downloads such a file,
computes its sha256, shows it and records it; every later install that records or
reads the same file name refuses a different hash. This is what nix and uv do for
direct URLs: the first download is trusted, a silent change afterwards is not.

Records (JSON, one per place):
- the environment's own (``greta-hashes.json`` in site-packages): what this
  environment was installed from;
- the user's (``hashes.json`` in platformdirs' user data dir): every file this user
  has installed anywhere, so a second environment on the machine is held to it;
- a file given with ``greta install --from-record FILE``: another machine's record,
  which turns N nodes into byte-identical copies of the first one.

Pure functions over `HashRecord`; reading and writing files are the only edges.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from greta_install.errors import GretaError

RECORD_NAME = "greta-hashes.json"
USER_RECORD_NAME = "hashes.json"
FORMAT = 1
_MAX_BYTES = 4 << 20  # a record is small; refuse to parse anything huge


class HashRecordError(GretaError, ValueError):
    """A record is unreadable, or a file's hash differs from the one recorded."""


@dataclass(frozen=True)
class Entry:
    name: str  # distribution
    version: str
    sha256: str  # "sha256:<hex>"
    source: str  # index URL (or "default") the file came from
    recorded_by: str = ""  # where the entry was first made ("this environment", a path)


@dataclass
class HashRecord:
    """filename -> Entry. Filenames are exact wheel/sdist names (they carry the tags)."""

    entries: dict[str, Entry] = field(default_factory=dict)
    origin: str = "record"

    def expected(self, filename: str) -> Entry | None:
        return self.entries.get(filename)

    def check(self, filename: str, sha256: str) -> Entry | None:
        """The recorded entry for this file; HashRecordError when its hash differs."""
        entry = self.entries.get(filename)
        if entry is not None and entry.sha256 != sha256:
            raise HashRecordError(
                f"{filename} has {sha256}, but {self.origin} recorded {entry.sha256} for the "
                f"same file ({entry.recorded_by or 'an earlier install'}): the file changed "
                "since it was first trusted. Refusing it. If the vendor really re-published "
                f"it, remove its entry from {self.origin} and install again."
            )
        return entry

    def add(self, filename: str, entry: Entry) -> None:
        self.check(filename, entry.sha256)
        self.entries.setdefault(filename, entry)

    def merged(self, other: HashRecord) -> HashRecord:
        """Both records' entries; HashRecordError when they disagree about a file."""
        out = HashRecord(dict(self.entries), self.origin)
        for filename, entry in other.entries.items():
            try:
                out.add(filename, entry)
            except HashRecordError:
                raise HashRecordError(
                    f"{self.origin} and {other.origin} record different hashes for {filename} "
                    f"({self.entries[filename].sha256} vs {entry.sha256})"
                ) from None
        return out

    def to_json(self) -> dict[str, object]:
        return {
            "format": FORMAT,
            "files": {
                name: {
                    "name": e.name,
                    "version": e.version,
                    "sha256": e.sha256,
                    "source": e.source,
                    "recorded_by": e.recorded_by,
                }
                for name, e in sorted(self.entries.items())
            },
        }


def parse_record(text: str, origin: str) -> HashRecord:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise HashRecordError(f"{origin} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise HashRecordError(f"{origin} is not a GRETA hash record (format {FORMAT})")
    files = data.get("files")
    if not isinstance(files, dict):
        raise HashRecordError(f"{origin}: `files` must be an object")
    record = HashRecord(origin=origin)
    for filename, raw in files.items():
        if not isinstance(raw, dict) or "/" in filename or filename.startswith("."):
            raise HashRecordError(f"{origin}: malformed entry {filename!r}")
        sha = raw.get("sha256")
        if not isinstance(sha, str) or not sha.startswith("sha256:") or len(sha) != 71:
            raise HashRecordError(f"{origin}: {filename}: malformed sha256 {sha!r}")
        record.entries[filename] = Entry(
            name=str(raw.get("name", "")),
            version=str(raw.get("version", "")),
            sha256=sha,
            source=str(raw.get("source", "")),
            recorded_by=str(raw.get("recorded_by", "")),
        )
    return record


def load_record(path: Path) -> HashRecord:
    """The record at `path` (empty when the file does not exist)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(_MAX_BYTES + 1)
    except FileNotFoundError:
        return HashRecord(origin=str(path))
    except OSError as exc:
        raise HashRecordError(f"cannot read {path}: {exc}") from None
    if len(data) > _MAX_BYTES:
        raise HashRecordError(f"{path} is larger than {_MAX_BYTES} bytes: not a hash record")
    return parse_record(data.decode("utf-8", errors="replace"), str(path))


def save_record(record: HashRecord, path: Path) -> None:
    """Write atomically (a crash leaves the old record or the new one, never half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".greta-hashes-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(record.to_json(), fh, indent=1, sort_keys=True)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def user_record_path() -> Path:
    """The user's record: every file this user has trusted, whatever the environment."""
    from greta_install.commandline import LocationError, env_location

    try:
        override = env_location("GRETA_HASH_RECORD")
    except LocationError as exc:
        raise HashRecordError(str(exc)) from None
    if override:
        return Path(override)
    import platformdirs

    return Path(platformdirs.user_data_dir("greta", appauthor=False)) / USER_RECORD_NAME


def env_record_path(site_packages: Path) -> Path:
    return site_packages / RECORD_NAME


def known_record(site_packages: Path | None, extra: Path | None = None) -> HashRecord:
    """Everything trusted so far that applies to an install into `site_packages`."""
    record = load_record(user_record_path())
    if site_packages is not None:
        record = record.merged(load_record(env_record_path(site_packages)))
    if extra is not None:
        if not extra.exists():
            raise HashRecordError(f"--from-record {extra}: no such file")
        if not extra.is_file():  # /dev/zero, a FIFO, a folder: said as what it is
            raise HashRecordError(f"--from-record {extra}: not a regular file")
        record = record.merged(load_record(extra))
    return record
