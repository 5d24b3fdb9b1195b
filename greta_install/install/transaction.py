"""Journalled install transactions: one environment, one writer, every change undoable.

pip and uv are transactional per package, not per install, and not at all when they are
killed. A `Transaction` makes a whole `greta install` one unit:

- `EnvLock`: an exclusive `flock` on the environment's site-packages directory, held for
  the whole install (and passed to the installer child, so a child that outlives GRETA
  keeps it). The kernel drops it when its holders die: a kill never leaves a stale lock.
- Before anything changes, the transaction writes its *intent* to a journal inside the
  environment (`<site-packages>/.greta-txn/journal.json`): every file the install may
  create, every file it may overwrite or remove (saved first as a hard link, or a copy,
  under `.greta-txn/backup/`), and the distributions it replaces.
- `undo()` removes exactly the files the journal says this install created and puts
  back exactly the files it saved; nothing else in the environment is touched. It is
  idempotent, so an undo that is itself interrupted is finished by the next run.
- `recover()`: the next run that takes the lock and finds a journal (GRETA was killed,
  the machine lost power) undoes it, or only cleans up when it had reached `done`.

Journal states: `prepare` (saving; the environment is untouched), `commit` (the installer
or a post-commit step may have changed the environment: undo on recovery), `done` (the
install is complete: recovery only removes the journal and backup).

A journal found on disk is data, not instructions: it is read with a size cap, parsed
into exact types, and acted on only when it belongs to this environment (its site path,
the device and inode of the site folder, and a random id the install wrote beside the
journal all match) and every path it names lies inside this environment's own install
roots once links are resolved. Anything else is refused with one line naming the
command that clears it; nothing is changed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from greta_install.boundedio import BoundedReadError, read_bytes
from greta_install.environment import wheelfiles
from greta_install.errors import GretaError

TXN_DIR = ".greta-txn"
JOURNAL = "journal.json"
# Beside the transaction folder, not in it: a copy of the environment copies both, but a
# new environment at a recycled path or inode has neither.
TXN_ID = ".greta-txn-id"
JOURNAL_SCHEMA = 2
# A journal lists every file of an install (torch: ~20k paths); far below this.
JOURNAL_MAX_BYTES = 64 * 1024 * 1024
LOCK_TIMEOUT_ENV = "GRETA_LOCK_TIMEOUT"
DEFAULT_LOCK_TIMEOUT_S = 1800.0
# Temporary entries installers leave beside what they replace when killed: pip's
# uninstall stash ("~lpha_pkg") and uv's/pip's adjacent temporary files.
_TEMP_PREFIXES = ("~", ".tmp")
CRITICAL_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

Log = Callable[[str], None]


class TransactionError(GretaError):
    """The environment cannot be locked, saved or put back; the message says its state."""


class JournalRefused(TransactionError):
    """A transaction folder GRETA will not act on (damaged, foreign, or naming paths outside
    the environment); the message names the command that clears it."""

    def __init__(self, txn_dir: Path, reason: str) -> None:
        self.txn_dir = txn_dir
        super().__init__(
            f"{txn_dir}: {reason}; nothing was changed. If no greta install is running on "
            f"this environment, clear it with: rm -rf -- {shlex.quote(str(txn_dir))} "
            f"{shlex.quote(str(txn_dir.parent / TXN_ID))} (then run greta install again)"
        )


# --- the environment lock ---------------------------------------------------------------


class EnvLock:
    """Exclusive lock on an environment: `flock` on its site-packages directory.

    Locking the directory itself creates no file, so a refused install leaves the
    environment byte-identical.
    """

    def __init__(self, site: Path) -> None:
        self.site = site
        self.fd: int | None = None

    def acquire(self, log: Log, timeout_s: float | None = None) -> None:
        if timeout_s is None:
            try:
                timeout_s = float(os.environ.get(LOCK_TIMEOUT_ENV, DEFAULT_LOCK_TIMEOUT_S))
            except ValueError:
                timeout_s = DEFAULT_LOCK_TIMEOUT_S
        try:
            fd = os.open(self.site, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise TransactionError(f"cannot open {self.site} to lock it: {exc.strerror}") from None
        deadline = time.monotonic() + timeout_s
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise TransactionError(f"cannot lock {self.site}: {exc.strerror}") from None
            if time.monotonic() >= deadline:
                os.close(fd)
                raise TransactionError(
                    f"another greta install is still changing {self.site} after {timeout_s:.0f} s; "
                    "nothing was installed (retry when it has finished)"
                )
            if not told:
                log("greta: another greta install is changing this environment; waiting for it")
                told = True
            time.sleep(0.2)
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the last descriptor drops the flock
            self.fd = None

    def __enter__(self) -> EnvLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# --- signals ----------------------------------------------------------------------------


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP arrived; `signum` says which (exit status 128 + signum)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """SIGTERM and SIGHUP raise `Interrupted` like Ctrl-C does, so cleanup runs for all."""
    if not _main_thread():
        yield
        return

    def raise_interrupted(signum: int, _frame: object) -> None:
        raise Interrupted(signum)

    previous = {s: signal.signal(s, raise_interrupted) for s in CRITICAL_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def ignore_signals() -> None:
    """From now on SIGINT/SIGTERM/SIGHUP are ignored (an undo is under way); the handlers
    `interruptible()` saved are restored when it exits."""
    if _main_thread():
        for s in CRITICAL_SIGNALS:
            signal.signal(s, signal.SIG_IGN)


@contextlib.contextmanager
def critical() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP while the journal and the environment are made consistent;
    a signal that arrives meanwhile is delivered when the section ends."""
    if not _main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, CRITICAL_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


# --- journal ----------------------------------------------------------------------------


@dataclass
class Journal:
    state: str  # prepare | commit | done
    site: str
    stage: str | None
    created: list[str] = field(default_factory=list)  # files the install may add
    saved: list[tuple[str, str]] = field(default_factory=list)  # (original, backup name)
    new_dirs: list[str] = field(default_factory=list)  # directories that did not exist
    dist_infos: list[str] = field(default_factory=list)  # dist-info dirs it writes or replaces
    temp_roots: list[str] = field(default_factory=list)  # dirs to sweep of installer temp names
    before_entries: dict[str, list[str]] = field(default_factory=dict)
    pid: int = field(default_factory=os.getpid)
    # Which environment this journal belongs to (see the module docstring).
    site_dev: int = 0
    site_ino: int = 0
    txn_id: str = ""

    def to_json(self) -> dict[str, object]:
        return {"schema": JOURNAL_SCHEMA, **self.__dict__}

    @classmethod
    def from_json(cls, data: object) -> Journal:
        """Exact types or JournalFormatError: a journal on disk is untrusted data."""
        if not isinstance(data, dict):
            raise JournalFormatError("it is not a JSON object")
        if data.get("schema") != JOURNAL_SCHEMA:
            raise JournalFormatError(f"unknown journal schema {str(data.get('schema'))[:20]!r}")
        unknown = sorted(set(data) - set(_JOURNAL_TYPES) - {"schema"})
        missing = sorted(set(_JOURNAL_TYPES) - set(data))
        if unknown or missing:
            raise JournalFormatError(f"unexpected fields {(unknown or missing)[:3]}")
        for key, check in _JOURNAL_TYPES.items():
            if not check(data[key]):
                raise JournalFormatError(f"field {key!r} has the wrong type")
        if data["state"] not in ("prepare", "commit", "done"):
            raise JournalFormatError(f"unknown state {str(data['state'])[:20]!r}")
        fields = {k: v for k, v in data.items() if k != "schema"}
        fields["saved"] = [(a, b) for a, b in data["saved"]]
        return cls(**fields)


class JournalFormatError(GretaError, ValueError):
    """The journal's JSON is not a journal (internal: recover() turns it into a refusal)."""


def _is_str(v: object) -> bool:
    return isinstance(v, str) and "\0" not in v and len(v) <= 4096


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 64


def _str_list(v: object) -> bool:
    return isinstance(v, list) and all(_is_str(x) for x in v)


_JOURNAL_TYPES: dict[str, Callable[[object], bool]] = {
    "state": _is_str,
    "site": _is_str,
    "stage": lambda v: v is None or _is_str(v),
    "created": _str_list,
    "saved": lambda v: (
        isinstance(v, list)
        and all(isinstance(p, list) and len(p) == 2 and _is_str(p[0]) and _is_str(p[1]) for p in v)
    ),
    "new_dirs": _str_list,
    "dist_infos": _str_list,
    "temp_roots": _str_list,
    "before_entries": lambda v: (
        isinstance(v, dict) and all(_is_str(k) and _str_list(x) for k, x in v.items())
    ),
    "pid": _is_int,
    "site_dev": _is_int,
    "site_ino": _is_int,
    "txn_id": _is_str,
}


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_json_durably(path: Path, data: object) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


# --- the transaction --------------------------------------------------------------------


class Transaction:
    """One install's changes to one environment (the caller holds its `EnvLock`)."""

    def __init__(self, site: Path, scheme: wheelfiles.Scheme, stage: Path | None) -> None:
        self.site = site
        self.scheme = scheme
        self.dir = site / TXN_DIR
        self.backup = self.dir / "backup"
        self.journal = Journal("prepare", str(site), str(stage) if stage else None)
        self._count = 0
        self._tracked: set[str] = set()
        self._begun = False

    # -- intent ---------------------------------------------------------------------------

    def begin(self) -> None:
        if self.dir.exists() or self.dir.is_symlink():
            raise TransactionError(f"{self.dir} exists: an earlier install was not recovered")
        with critical():
            info = os.stat(self.site)
            self.journal.site_dev, self.journal.site_ino = info.st_dev, info.st_ino
            self.journal.txn_id = secrets.token_hex(16)
            _write_id(self.site / TXN_ID, self.journal.txn_id)
            self.dir.mkdir()
            self._begun = True
            self.backup.mkdir()
            self.journal.temp_roots = sorted({str(r) for r in self.scheme.roots if r.is_dir()})
            self.journal.before_entries = {
                root: sorted(os.listdir(root)) for root in self.journal.temp_roots
            }
            self._write()

    def add_wheels(self, wheels: Iterable[Path]) -> None:
        """Record (and save what they overwrite) the files these wheels will install, and
        the installed distributions of the same projects they replace. Call before the
        installer runs; the journal is durable when this returns."""
        with critical():
            facts = [wheelfiles.read_wheel(w) for w in wheels]
            replaced = wheelfiles.installed_dist_infos(self.scheme.purelib, [f.name for f in facts])
            if self.scheme.platlib != self.scheme.purelib:
                replaced += wheelfiles.installed_dist_infos(
                    self.scheme.platlib, [f.name for f in facts]
                )
            paths: list[Path] = []
            for f in facts:
                paths += wheelfiles.install_paths(f, self.scheme)
                root = self.scheme.purelib if f.root_is_purelib else self.scheme.platlib
                self._dist_info(root / f.dist_info)
            for info in replaced:
                self._dist_info(info)
                paths += wheelfiles.record_paths(info, self.scheme.roots)
            for path in paths:
                self.track_file(path, _write=False)
            self.journal.state = "commit"
            self._write()

    def track_file(self, path: Path, _write: bool = True) -> None:
        """Declare that the install may create, overwrite or delete `path`: it is saved
        now (if it exists) and removed or put back by an undo."""
        key = str(Path(os.path.normpath(path)))
        if key in self._tracked:
            return
        self._tracked.add(key)
        p = Path(key)
        if p.is_symlink() or p.is_file():
            name = str(self._count)
            self._count += 1
            _save(p, self.backup / name)
            self.journal.saved.append((key, name))
        elif p.is_dir():
            # A wheel file where a directory stands: an installer may delete the directory.
            for inner in sorted(p.rglob("*")):
                if inner.is_file() or inner.is_symlink():
                    self.track_file(inner, _write=False)
        elif not p.exists():
            self.journal.created.append(key)
            parent = p.parent
            missing = []
            while not parent.exists() and parent != parent.parent:
                missing.append(str(parent))
                parent = parent.parent
            self.journal.new_dirs += [d for d in missing if d not in self.journal.new_dirs]
        if _write:
            with critical():
                self.journal.state = "commit"
                self._write()

    def _dist_info(self, info: Path) -> None:
        key = str(info)
        if key in self.journal.dist_infos:
            return
        self.journal.dist_infos.append(key)
        if info.is_dir():
            for path in sorted(info.rglob("*")):
                if path.is_file() or path.is_symlink():
                    self.track_file(path, _write=False)
        else:
            self.journal.new_dirs.append(key)

    def _write(self) -> None:
        _write_json_durably(self.dir / JOURNAL, self.journal.to_json())

    # -- outcome --------------------------------------------------------------------------

    def finish(self) -> None:
        """The install is complete: mark it done, then drop the journal and backup."""
        with critical():
            self.journal.state = "done"
            self._write()
            _discard(self.dir)
            _drop_id(self.site)

    def undo(self) -> list[str]:
        """Put the environment back as it was before `begin`; what was done, in words."""
        if not self._begun:
            return []  # nothing of ours to undo (and the folder, if any, is not ours)
        with critical():
            done = _undo(self.journal, self.backup)
            _discard(self.dir)
            _drop_id(self.site)
            return done


def _save(path: Path, copy: Path) -> None:
    if path.is_symlink():
        os.symlink(os.readlink(path), copy)
        return
    try:
        os.link(path, copy)
    except OSError:  # another filesystem, or hard links not allowed: copy instead
        shutil.copy2(path, copy)


def _same(a: Path, b: Path) -> bool:
    try:
        if a.is_symlink() or b.is_symlink():
            return a.is_symlink() and b.is_symlink() and os.readlink(a) == os.readlink(b)
        if os.path.samefile(a, b):
            return True
        if a.stat().st_size != b.stat().st_size:
            return False
        with open(a, "rb") as fa, open(b, "rb") as fb:
            while True:
                x, y = fa.read(1 << 20), fb.read(1 << 20)
                if x != y:
                    return False
                if not x:
                    return True
    except OSError:
        return False


def _put_back(copy: Path, original: Path, roots: Iterable[str] = ()) -> None:
    _make_dir(original.parent, roots)
    if original.is_dir() and not original.is_symlink():
        shutil.rmtree(original)
    try:
        os.replace(copy, original)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        tmp = original.with_name(f".{original.name}.greta-restore")
        shutil.copy2(copy, tmp, follow_symlinks=False)
        os.replace(tmp, original)
        copy.unlink()


def _make_dir(directory: Path, roots: Iterable[str]) -> None:
    """Make `directory` a directory again. A file or symlink in its place (or in a parent's,
    inside the environment) was put there by the install being undone: the saved file
    below it proves a directory stood there before."""
    inside = [Path(r) for r in roots]
    for parent in [*reversed(directory.parents), directory]:
        if not any(parent != r and parent.is_relative_to(r) for r in inside):
            continue
        if parent.is_symlink() or (parent.exists() and not parent.is_dir()):
            parent.unlink()
    directory.mkdir(parents=True, exist_ok=True)


def _remove(path: Path) -> bool:
    try:
        if path.is_symlink() or path.is_file():
            path.unlink()
            return True
        if path.is_dir():
            shutil.rmtree(path)
            return True
    except FileNotFoundError:
        pass
    return False


def _undo(journal: Journal, backup: Path) -> list[str]:
    """Remove what the journal's install added, put back what it replaced (idempotent)."""
    removed = _remove_created(journal.created)
    _trim_dist_infos(journal)
    put_back = _put_back_saved(journal, backup)
    _sweep_installer_temp(journal.before_entries)
    _prune_new_dirs(journal.new_dirs)
    done = []
    if removed:
        done.append(f"removed {removed} files it had added")
    if put_back:
        done.append(f"put back {put_back} files it had replaced")
    return done


def _remove_created(created: Iterable[str]) -> int:
    removed = 0
    for path in created:
        p = Path(path)
        if _remove(p):
            removed += 1
        if p.suffix == ".py":  # bytecode the installer or an import compiled for it
            for pyc in (p.parent / "__pycache__").glob(f"{p.stem}.*.pyc"):
                pyc.unlink(missing_ok=True)
    return removed


def _trim_dist_infos(journal: Journal) -> None:
    """New dist-infos go; one that existed loses what the install added to it."""
    saved_originals = {original for original, _ in journal.saved}
    for info in journal.dist_infos:
        p = Path(info)
        if not p.is_dir():
            continue
        if info in journal.new_dirs:
            shutil.rmtree(p, ignore_errors=True)
            continue
        for f in sorted(p.rglob("*"), reverse=True):
            if (f.is_file() or f.is_symlink()) and str(f) not in saved_originals:
                f.unlink()


def _put_back_saved(journal: Journal, backup: Path) -> int:
    put_back = 0
    for original, name in journal.saved:
        copy = backup / name
        target = Path(original)
        if not (copy.exists() or copy.is_symlink()):
            continue  # put back by an earlier, interrupted undo
        if (target.exists() or target.is_symlink()) and _same(target, copy):
            continue
        _put_back(copy, target, journal.temp_roots)
        put_back += 1
    return put_back


def _sweep_installer_temp(before_entries: dict[str, list[str]]) -> None:
    """Temporary entries a killed installer left beside what it replaced."""
    for root, entries in before_entries.items():
        known = set(entries)
        try:
            now = os.listdir(root)
        except OSError:
            continue
        for entry in now:
            if entry not in known and entry.startswith(_TEMP_PREFIXES):
                _remove(Path(root) / entry)


def _prune_new_dirs(new_dirs: Iterable[str]) -> None:
    for directory in sorted(new_dirs, key=len, reverse=True):
        d = Path(directory)
        cache = d / "__pycache__"
        with contextlib.suppress(OSError):
            if cache.is_dir() and not any(cache.iterdir()):
                cache.rmdir()
        with contextlib.suppress(OSError):
            d.rmdir()


def _discard(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    _fsync_dir(directory.parent)


# --- recovery ---------------------------------------------------------------------------


def _write_id(path: Path, value: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        fh.write(value)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _drop_id(site: Path) -> None:
    for name in (TXN_ID, TXN_ID + ".tmp"):
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            (site / name).unlink()


def _read_id(site: Path) -> str | None:
    try:
        raw = read_bytes(site / TXN_ID, 64, follow_symlinks=False)
    except OSError:  # absent, a link, a FIFO, too long: not an id this GRETA wrote
        return None
    text = raw.decode("ascii", "replace")
    return text if re.fullmatch(r"[0-9a-f]{32}", text) else None


def load_journal(txn_dir: Path) -> Journal | None:
    """The journal in `txn_dir` (a real directory), None when there is none yet (the install
    died before writing its first one, having changed nothing). JournalRefused when it
    cannot be a journal GRETA wrote: read capped, never following a link or a FIFO."""
    try:
        raw = read_bytes(txn_dir / JOURNAL, JOURNAL_MAX_BYTES, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except BoundedReadError as exc:
        raise JournalRefused(txn_dir, f"its journal is unusable ({exc})") from None
    except OSError as exc:
        reason = "a symlink" if exc.errno == errno.ELOOP else exc.strerror or str(exc)
        raise JournalRefused(txn_dir, f"its journal cannot be read ({reason})") from None
    try:
        return Journal.from_json(json.loads(raw.decode("utf-8")))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError, JSON, JournalFormatError
        what = str(exc) if isinstance(exc, JournalFormatError) else exc.__class__.__name__
        raise JournalRefused(txn_dir, f"its journal is damaged ({what[:120]})") from None


def _real_inside(path: str, roots: list[str], *, strict: bool = True) -> bool:
    """`path` (absolute, normalised) lies inside one of the `roots` (real paths) once the
    links of its folders are resolved; its last component is judged as it stands, so a
    link the install created is removed, never followed."""
    if not os.path.isabs(path) or os.path.normpath(path) != path:
        return False
    head, name = os.path.split(path)
    if name in ("", ".", ".."):
        return False
    real = os.path.join(os.path.realpath(head), name)
    return any(real.startswith(r + os.sep) or (not strict and real == r) for r in roots)


def check_journal(journal: Journal, site: Path, roots: Iterable[Path], txn_dir: Path) -> None:
    """JournalRefused unless `journal` belongs to the environment at `site` and every path
    it names lies inside that environment's `roots` (its install scheme)."""
    if journal.site != str(site):
        raise JournalRefused(
            txn_dir, f"its journal belongs to another environment ({journal.site[:200]})"
        )
    info = os.stat(site)
    if (journal.site_dev, journal.site_ino) != (info.st_dev, info.st_ino):
        raise JournalRefused(
            txn_dir, "its journal was written for another copy of this environment's folder"
        )
    if _read_id(site) != journal.txn_id:
        raise JournalRefused(txn_dir, f"its journal does not match {site / TXN_ID}")
    real_roots = sorted({os.path.realpath(r) for r in roots})
    files = [*journal.created, *(original for original, _ in journal.saved)]
    # Folders an undo walks or removes: judged with every link resolved, their own too.
    folders = [*journal.new_dirs, *journal.dist_infos]
    outside = [p for p in files if not _real_inside(p, real_roots)]
    outside += [
        p
        for p in folders
        if not (_real_inside(p, real_roots) and _real_inside(os.path.realpath(p), real_roots))
    ]
    outside += [
        r
        for r in [*journal.temp_roots, *journal.before_entries]
        if os.path.realpath(r) not in real_roots or os.path.normpath(r) != r
    ]
    outside += [
        e for v in journal.before_entries.values() for e in v if "/" in e or e in ("", ".", "..")
    ]
    outside += [name for _, name in journal.saved if not re.fullmatch(r"\d{1,9}", name)]
    if outside:
        raise JournalRefused(
            txn_dir, f"its journal names paths outside this environment ({outside[0][:200]!r})"
        )
    backup = txn_dir / "backup"
    if backup.is_symlink() or (backup.exists() and not backup.is_dir()):
        raise JournalRefused(txn_dir, "its backup folder is not a folder GRETA wrote")


def recover(site: Path, log: Log, roots: Iterable[Path]) -> list[str]:
    """Finish what an earlier, killed install left (the caller holds the EnvLock).

    `roots` are the environment's install roots (its scheme): a journal naming anything
    elsewhere is refused. Returns what was done, in words; [] when there was nothing to
    recover. JournalRefused (nothing changed) for a journal that is not this
    environment's.
    """
    txn_dir = site / TXN_DIR
    try:
        mode = os.lstat(txn_dir).st_mode
    except FileNotFoundError:
        _drop_id(site)  # killed between writing the id and making the folder
        return []
    if not stat.S_ISDIR(mode):
        kind = "a symlink" if stat.S_ISLNK(mode) else "not a folder"
        raise JournalRefused(txn_dir, f"it is {kind}, not a transaction folder GRETA wrote")
    journal = load_journal(txn_dir)
    done: list[str] = []
    if journal is None:
        # The earlier install died before its first journal was durable: it changed nothing.
        with critical():
            _discard(txn_dir)
            _drop_id(site)
        return ["removed an unfinished transaction folder (no journal yet)"]
    check_journal(journal, site, roots, txn_dir)
    with critical():
        if journal.state == "commit":
            done += _undo(journal, txn_dir / "backup")
            done.insert(0, f"undid the interrupted install of process {journal.pid}")
        elif journal.state == "done":
            done.append(f"cleaned up after the completed install of process {journal.pid}")
        else:
            done.append(f"removed the unstarted install of process {journal.pid}")
        # The stage (outside the environment) is left to sweep_stale_stages, which removes
        # only unlocked greta-stage-* folders: a journal never names what gets deleted there.
        _discard(txn_dir)
        _drop_id(site)
    for line in done:
        log(f"greta: recovered: {line}")
    return done


# --- staging directories ----------------------------------------------------------------

STAGE_PREFIX = "greta-stage-"


def lock_stage(directory: Path) -> int:
    """Hold a stage directory: a sweeper that can lock it knows its owner is gone."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def sweep_stale_stages(parent: Path, log: Log) -> int:
    """Remove `greta-stage-*` folders whose process died (no one holds their lock).

    A stage is locked before it is renamed to its `greta-stage-` name, so an unlocked one
    is never one being set up."""
    swept = 0
    try:
        candidates = [p for p in parent.iterdir() if p.name.startswith(STAGE_PREFIX)]
    except OSError:
        return 0
    for path in candidates:
        if path.is_symlink() or not path.is_dir():
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # a live install owns it
            shutil.rmtree(path, ignore_errors=True)
            swept += 1
        finally:
            os.close(fd)
    if swept:
        log(f"greta: removed {swept} staging folder(s) left by killed installs in {parent}")
    return swept
