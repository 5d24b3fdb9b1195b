"""Undo a failed offline install: put an environment's packages back as they were.

pip and uv are transactional per package, not per install: when the third of five wheels
fails (a full disk, a file clash), the first two stay installed over the versions they
replaced. Before `greta install` runs the installer, `backup()` hard-links every file of
the installed distributions it will replace (their ``RECORD``) into a directory inside the
environment; links cost no copy and keep the old bytes alive when the installer deletes
the originals. If the installer fails, `restore()` removes every distribution that was not
there before (by its ``RECORD``) and moves the saved files back. Stdlib + packaging only.
"""

from __future__ import annotations

import csv
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name


@dataclass
class Backup:
    site: Path  # the environment's site-packages
    directory: Path  # where the saved files live (same filesystem as `site`)
    before: set[str]  # *.dist-info directory names present before the install
    saved: list[tuple[Path, Path]] = field(default_factory=list)  # (original, saved copy)


def _dist_infos(site: Path) -> dict[str, Path]:
    return {p.name: p for p in site.glob("*.dist-info") if p.is_dir()}


def _dist_name(info: Path) -> str:
    """Canonical project name of a dist-info directory (METADATA, else its directory name)."""
    try:
        for line in (info / "METADATA").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith("name:"):
                return canonicalize_name(line.split(":", 1)[1].strip())
            if not line.strip():
                break
    except OSError:
        pass
    return canonicalize_name(info.name[: -len(".dist-info")].rsplit("-", 1)[0])


def record_files(info: Path, root: Path) -> list[Path]:
    """Files a distribution installed (its RECORD), resolved; only those inside `root`."""
    try:
        with (info / "RECORD").open(newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
    except OSError:
        return [info / "METADATA"]
    files = []
    root = root.resolve()
    for row in rows:
        if not row or not row[0]:
            continue
        path = Path(os.path.normpath(info.parent / row[0]))
        # A RECORD may name ../../../bin/x; never touch anything outside the environment.
        if path.resolve().is_relative_to(root):
            files.append(path)
    return files


def env_root(site: Path) -> Path:
    """The environment directory above lib/pythonX.Y/site-packages (or site itself)."""
    parts = site.resolve().parts
    return Path(*parts[:-3]) if len(parts) > 3 and parts[-3] == "lib" else site.resolve()


def backup(site: Path, names: Iterable[str]) -> Backup:
    """Save the files of the installed distributions among `names` (those the install replaces)."""
    wanted = {canonicalize_name(n) for n in names}
    infos = _dist_infos(site)
    directory = Path(tempfile.mkdtemp(prefix=".greta-rollback-", dir=site.parent))
    saved = Backup(site, directory, set(infos))
    root = env_root(site)
    count = 0
    for info in infos.values():
        if _dist_name(info) not in wanted:
            continue
        for path in record_files(info, root):
            if not path.is_file() or path.is_symlink():
                continue
            copy = directory / str(count)
            count += 1
            try:
                os.link(path, copy)
            except OSError:  # another filesystem, or links not allowed: copy instead
                shutil.copy2(path, copy)
            saved.saved.append((path, copy))
    return saved


def restore(saved: Backup) -> list[str]:
    """Remove what the failed install added and put back what it replaced; what was done."""
    done = []
    root = env_root(saved.site)
    for name, info in sorted(_dist_infos(saved.site).items()):
        if name in saved.before:
            continue
        removed = 0
        for path in record_files(info, root):
            if path.is_file() or path.is_symlink():
                path.unlink()
                removed += 1
                _prune_empty(path.parent, saved.site)
        shutil.rmtree(info, ignore_errors=True)
        done.append(f"removed {name[: -len('.dist-info')]} ({removed} files)")
    put_back = 0
    for original, copy in saved.saved:
        if original.is_file() and os.path.samefile(original, copy):
            continue  # untouched (a hard link to the same bytes)
        original.parent.mkdir(parents=True, exist_ok=True)
        os.replace(copy, original)
        put_back += 1
    if put_back:
        done.append(f"put back {put_back} files of the replaced versions")
    return done


def _prune_empty(directory: Path, stop: Path) -> None:
    """Remove `directory` and its parents while empty, up to (not including) `stop`."""
    stop = stop.resolve()
    current = directory.resolve()
    while current != stop and current.is_relative_to(stop):
        pycache = current / "__pycache__"
        if pycache.is_dir() and not any(pycache.iterdir()):
            pycache.rmdir()
        try:
            current.rmdir()
        except OSError:
            return
        current = current.parent


def discard(saved: Backup | None) -> None:
    if saved is not None:
        shutil.rmtree(saved.directory, ignore_errors=True)
