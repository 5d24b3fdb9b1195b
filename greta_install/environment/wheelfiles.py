"""What a wheel contains and where an installer puts it (stdlib + packaging, no side effects).

Two users: the install transaction, which must know every path a staged wheel will write
before the installer runs (to back up what it overwrites and to remove what it adds if the
install is undone), and the kernel-wheel check, which refuses a wheel whose RECORD does not
match its files or that reaches outside its own package.
"""

from __future__ import annotations

import base64
import configparser
import csv
import hashlib
import io
import os
import posixpath
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

from greta_install.errors import GretaError

# A wheel member or RECORD line naming more than this is hostile, not a package.
MAX_MEMBERS = 200_000
MAX_RECORD_BYTES = 64 * 1024 * 1024
MAX_METADATA_BYTES = 1024 * 1024


class WheelError(GretaError, ValueError):
    """A wheel that cannot be read, or whose contents break a rule; names the wheel."""


@dataclass(frozen=True)
class Scheme:
    """Install locations of one environment (sysconfig paths of its interpreter)."""

    purelib: Path
    platlib: Path
    scripts: Path
    data: Path
    include: Path  # pip puts a wheel's headers in <data>/include/site/pythonX.Y/<dist>
    python: str  # "3.11"

    @classmethod
    def from_paths(cls, paths: Mapping[str, str], python: str) -> Scheme:
        return cls(
            purelib=Path(paths["purelib"]),
            platlib=Path(paths["platlib"]),
            scripts=Path(paths["scripts"]),
            data=Path(paths["data"]),
            include=Path(paths["data"]) / "include" / "site" / f"python{python}",
            python=python,
        )

    @property
    def roots(self) -> tuple[Path, ...]:
        """Directories an install may write into (the environment's own tree)."""
        return tuple(dict.fromkeys((self.purelib, self.platlib, self.scripts, self.data)))


@dataclass(frozen=True)
class WheelFacts:
    path: Path
    name: str  # canonical project name
    dist_info: str  # "alpha_pkg-1.0.dist-info"
    members: tuple[str, ...]  # file members (no directories)
    root_is_purelib: bool
    scripts: tuple[str, ...]  # console/gui entry-point script names


def _read_member(zf: zipfile.ZipFile, name: str, cap: int) -> bytes:
    info = zf.getinfo(name)
    if info.file_size > cap:
        raise WheelError(f"{name} is {info.file_size} bytes (over {cap})")
    with zf.open(info) as fh:
        return fh.read(cap + 1)[:cap]


def read_wheel(path: Path) -> WheelFacts:
    """The facts of a wheel file; WheelError when it is not a readable wheel."""
    try:
        name, _version, _build, _tags = parse_wheel_filename(path.name)
    except ValueError as exc:
        raise WheelError(f"{path.name}: not a wheel file name ({exc})") from None
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            if len(infos) > MAX_MEMBERS:
                raise WheelError(f"{path.name}: {len(infos)} members (over {MAX_MEMBERS})")
            members = tuple(i.filename for i in infos if not i.is_dir())
            infos_dirs = {
                m.split("/", 1)[0] for m in members if m.split("/", 1)[0].endswith(".dist-info")
            }
            if len(infos_dirs) != 1:
                raise WheelError(f"{path.name}: {len(infos_dirs)} .dist-info directories (want 1)")
            dist_info = infos_dirs.pop()
            wheel_text = _read_member(zf, f"{dist_info}/WHEEL", MAX_METADATA_BYTES).decode(
                "utf-8", "replace"
            )
            entry = f"{dist_info}/entry_points.txt"
            entry_text = (
                _read_member(zf, entry, MAX_METADATA_BYTES).decode("utf-8", "replace")
                if entry in members
                else ""
            )
    except (OSError, zipfile.BadZipFile, KeyError, EOFError) as exc:
        raise WheelError(f"{path.name}: unreadable wheel ({exc})") from None
    root_is_purelib = any(
        line.split(":", 1)[1].strip().lower() == "true"
        for line in wheel_text.splitlines()
        if line.lower().startswith("root-is-purelib:")
    )
    return WheelFacts(
        path,
        canonicalize_name(name),
        dist_info,
        members,
        root_is_purelib,
        tuple(_scripts_of(entry_text)),
    )


def _scripts_of(entry_points: str) -> list[str]:
    parser = configparser.ConfigParser(interpolation=None, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    try:
        parser.read_string(entry_points)
    except configparser.Error:
        return []
    names = []
    for section in ("console_scripts", "gui_scripts"):
        if parser.has_section(section):
            names += [n.strip() for n in parser.options(section) if _safe_component(n.strip())]
    return names


def _safe_component(name: str) -> bool:
    return bool(name) and "/" not in name and "\\" not in name and name not in (".", "..")


def _inside(path: Path, roots: Iterable[Path]) -> bool:
    resolved = Path(os.path.normpath(path))
    return any(resolved.is_relative_to(Path(os.path.normpath(r))) for r in roots)


def install_paths(facts: WheelFacts, scheme: Scheme) -> list[Path]:
    """Every file path installing `facts` may create, absolute; members that would land
    outside the environment are left out (an installer refuses them anyway)."""
    root = scheme.purelib if facts.root_is_purelib else scheme.platlib
    data_dir = facts.dist_info[: -len(".dist-info")] + ".data"
    targets = {
        "purelib": scheme.purelib,
        "platlib": scheme.platlib,
        "scripts": scheme.scripts,
        "data": scheme.data,
        "headers": scheme.include / facts.name,
    }
    out: list[Path] = []
    for member in facts.members:
        head, _, rest = member.partition("/")
        if head == data_dir:
            category, _, sub = rest.partition("/")
            base = targets.get(category)
            if base is None or not sub:
                continue
            path = base / sub
        else:
            path = root / member
        path = Path(os.path.normpath(path))
        if _inside(path, scheme.roots):
            out.append(path)
    for name in facts.scripts:
        out.append(scheme.scripts / name)
    # Files installers add to the dist-info beyond what the wheel ships.
    info = root / facts.dist_info
    out += [info / n for n in ("INSTALLER", "REQUESTED", "direct_url.json", "RECORD")]
    return sorted(set(out))


def installed_dist_infos(site: Path, names: Iterable[str]) -> list[Path]:
    """The *.dist-info directories in `site` of the projects named."""
    wanted = {canonicalize_name(n) for n in names}
    found = []
    try:
        entries = sorted(site.iterdir())
    except OSError:
        return []
    for entry in entries:
        if entry.name.endswith(".dist-info") and entry.is_dir() and dist_name(entry) in wanted:
            found.append(entry)
    return found


def dist_name(info: Path) -> str:
    """Canonical project name of a dist-info directory (METADATA, else its directory name)."""
    try:
        with open(info / "METADATA", "rb") as fh:
            head = fh.read(MAX_METADATA_BYTES).decode("utf-8", "replace")
        for line in head.splitlines():
            if line.lower().startswith("name:"):
                return canonicalize_name(line.split(":", 1)[1].strip())
            if not line.strip():
                break
    except OSError:
        pass
    return canonicalize_name(info.name[: -len(".dist-info")].rsplit("-", 1)[0])


def record_paths(info: Path, roots: Iterable[Path]) -> list[Path]:
    """Files an installed distribution's RECORD names, absolute, only inside `roots`."""
    try:
        with open(info / "RECORD", "rb") as fh:
            text = fh.read(MAX_RECORD_BYTES).decode("utf-8", "replace")
    except OSError:
        return []
    roots = tuple(roots)
    out = []
    for row in csv.reader(io.StringIO(text)):
        if not row or not row[0]:
            continue
        path = Path(os.path.normpath(info.parent / row[0]))
        # A RECORD may name ../../../../etc/x: never touch anything outside the environment.
        if _inside(path, roots):
            out.append(path)
    return out


# --- content rules (kernel wheels) ------------------------------------------------------


def record_digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def check_record(path: Path) -> None:
    """Every member is in RECORD with its sha256 and size, and RECORD lists nothing more."""
    facts = read_wheel(path)
    record_name = f"{facts.dist_info}/RECORD"
    try:
        with zipfile.ZipFile(path) as zf:
            if record_name not in facts.members:
                raise WheelError(f"{path.name}: no {record_name}")
            rows = list(
                csv.reader(
                    io.StringIO(
                        _read_member(zf, record_name, MAX_RECORD_BYTES).decode("utf-8", "replace")
                    )
                )
            )
            listed: dict[str, tuple[str, str]] = {}
            for row in rows:
                if not row or not row[0]:
                    continue
                if len(row) != 3:
                    raise WheelError(f"{path.name}: malformed RECORD row {row!r}")
                listed[row[0]] = (row[1], row[2])
            for member in facts.members:
                if member == record_name:
                    continue
                if member not in listed:
                    raise WheelError(f"{path.name}: {member} is not in RECORD")
                digest, size = listed.pop(member)
                data = _read_member(zf, member, 1 << 31)
                if not digest.startswith("sha256=") or digest != record_digest(data):
                    raise WheelError(f"{path.name}: {member} does not match its RECORD hash")
                if size and size != str(len(data)):
                    raise WheelError(f"{path.name}: {member} does not match its RECORD size")
            listed.pop(record_name, None)
            if listed:
                raise WheelError(
                    f"{path.name}: RECORD names files the wheel lacks: {', '.join(sorted(listed)[:5])}"
                )
    except (OSError, zipfile.BadZipFile, EOFError) as exc:
        raise WheelError(f"{path.name}: unreadable wheel ({exc})") from None


def check_confined(path: Path, packages: Iterable[str]) -> None:
    """The wheel installs only into its own top-level packages and its dist-info: no `.pth`
    (runs at every interpreter start), no scripts or data, no files of other packages."""
    facts = read_wheel(path)
    for member in facts.members:
        check_member(path.name, member, facts.dist_info, packages)


def check_member(
    label: str, member: str, dist_info: str, packages: Iterable[str], installed: bool = False
) -> None:
    """`check_confined`'s rule for one file: a wheel member, or (`installed`) a RECORD row
    of an installed distribution (paths relative to its site-packages)."""
    allowed = set(packages)
    parts = member.split("/")
    if any(p in ("", ".", "..") for p in parts) or member.startswith("/") or "\\" in member:
        raise WheelError(f"{label}: member {member!r} has an unsafe path")
    head = parts[0]
    if head == dist_info:
        if parts[-1] == "entry_points.txt":
            raise WheelError(f"{label}: declares entry points (scripts); refused")
        return
    if head.endswith(".data"):
        raise WheelError(f"{label}: installs {member} outside its package (.data); refused")
    if len(parts) == 1 or head not in allowed:
        where = "installed" if installed else "installs"
        raise WheelError(
            f"{label}: {where} {member} outside its own package "
            f"({', '.join(sorted(allowed))}); refused"
        )
    if posixpath.splitext(member)[1].lower() == ".pth":
        raise WheelError(f"{label}: contains {member} (.pth files run code); refused")


def installed_record(info: Path) -> dict[str, str]:
    """An installed distribution's RECORD: path (relative to its site-packages, as written)
    -> its "sha256=..." digest ("" when the row has none); WheelError when unreadable."""
    try:
        with open(info / "RECORD", "rb") as fh:
            raw = fh.read(MAX_RECORD_BYTES + 1)
    except OSError as exc:
        raise WheelError(f"{info.name}: no readable RECORD ({exc})") from None
    if len(raw) > MAX_RECORD_BYTES:
        raise WheelError(f"{info.name}/RECORD is over {MAX_RECORD_BYTES} bytes")
    rows: dict[str, str] = {}
    for row in csv.reader(io.StringIO(raw.decode("utf-8", "replace"))):
        if not row or not row[0]:
            continue
        if len(row) != 3:
            raise WheelError(f"{info.name}: malformed RECORD row {row[:3]!r}")
        rows[row[0]] = row[1]
        if len(rows) > MAX_MEMBERS:
            raise WheelError(f"{info.name}: RECORD names over {MAX_MEMBERS} files")
    return rows


def read_member_text(path: Path, member: str, cap: int = MAX_METADATA_BYTES) -> str | None:
    """One small member of a wheel as text, or None when absent."""
    try:
        with zipfile.ZipFile(path) as zf:
            return _read_member(zf, member, cap).decode("utf-8", "replace")
    except KeyError:
        return None
    except (OSError, zipfile.BadZipFile, EOFError) as exc:
        raise WheelError(f"{path.name}: unreadable wheel ({exc})") from None
