"""The install journal is data (issue 30, items 1-3): it is read capped and typed, acted on
only by the environment that wrote it, and never names a path outside that environment.

Each repro of the issue is a case here, with variants of the same kind of input: a refused
journal changes nothing anywhere and says, in one line, the command that clears it."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _install_helpers import REPO, make_wheel

from greta_install.environment import wheelfiles
from greta_install.install import transaction


def _scheme(env: Path) -> wheelfiles.Scheme:
    site = env / "lib" / "python3.11" / "site-packages"
    paths = {"purelib": site, "platlib": site, "scripts": env / "bin", "data": env}
    return wheelfiles.Scheme.from_paths({k: str(v) for k, v in paths.items()}, "3.11")


def _tree(root: Path) -> dict[str, str]:
    """Every entry under `root` (files with contents, links with targets, folders)."""
    out: dict[str, str] = {}
    for p in sorted(root.rglob("*")):
        key = str(p.relative_to(root))
        if p.is_symlink():
            out[key] = "->" + os.readlink(p)
        elif p.is_file():
            out[key] = _content(p)
        else:
            out[key] = "<dir>"
    return out


def _content(path: Path) -> str:
    """A file's text; past 1 MiB its size and a digest of its data extents and where they
    lie. Holes read as zeros, so equal descriptions mean equal contents (a write, even of
    zeros, changes it), without reading the 2 GiB sparse journal's holes; a filesystem
    without holes reports the whole file as data."""
    size = path.stat().st_size
    if size <= 1 << 20:
        return path.read_text(errors="replace")
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        fd, pos = fh.fileno(), 0
        while pos < size:
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError:  # ENXIO: only a hole from `pos` to the end
                break
            end = os.lseek(fd, start, os.SEEK_HOLE)
            fh.seek(start)
            digest.update(f"@{start}:".encode())
            while fh.tell() < end and (chunk := fh.read(min(end - fh.tell(), 1 << 20))):
                digest.update(chunk)
            pos = end
    return f"<{size} bytes, data {digest.hexdigest()}>"


def _killed_install(tmp_path: Path, name: str = "env") -> tuple[wheelfiles.Scheme, dict]:
    """An environment whose install was killed mid-commit: alpha 1.0 half replaced by 2.0."""
    env = tmp_path / name
    scheme = _scheme(env)
    site = scheme.purelib
    (env / "bin").mkdir(parents=True)
    (site / "alpha").mkdir(parents=True)
    (site / "alpha" / "__init__.py").write_text("v1")
    info = site / "alpha-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: alpha\nVersion: 1.0\n")
    (info / "RECORD").write_text("alpha/__init__.py,,\nalpha-1.0.dist-info/METADATA,,\n")
    before = _tree(env)
    wheel_name, data = make_wheel("alpha", "2.0", extra={"alpha/new.py": b"n"})
    (tmp_path / f"wheels-{name}").mkdir()
    wheel = tmp_path / f"wheels-{name}" / wheel_name
    wheel.write_bytes(data)
    txn = transaction.Transaction(site, scheme, None)
    txn.begin()
    txn.add_wheels([wheel])
    (site / "alpha" / "__init__.py").unlink()
    (site / "alpha" / "__init__.py").write_text("v2")
    (site / "alpha" / "new.py").write_text("n")
    return scheme, before


def _journal(site: Path) -> dict:
    return json.loads((site / transaction.TXN_DIR / transaction.JOURNAL).read_text())


def _write_journal(site: Path, data: object) -> None:
    (site / transaction.TXN_DIR / transaction.JOURNAL).write_text(json.dumps(data))


def _refused(scheme: wheelfiles.Scheme) -> str:
    with pytest.raises(transaction.JournalRefused) as info:
        transaction.recover(scheme.purelib, lambda m: None, scheme.roots)
    message = str(info.value)
    assert "\n" not in message and "nothing was changed" in message
    assert f"rm -rf -- {scheme.purelib / transaction.TXN_DIR}" in message
    return message


# --- item 1: a journal is tied to its environment ---------------------------------------


def test_a_copied_environment_never_recovers_into_the_original(tmp_path: Path) -> None:
    """cp -a A B of a killed install; A repaired; recovering B must not touch A (or B)."""
    scheme_a, before_a = _killed_install(tmp_path, "a")
    shutil.copytree(tmp_path / "a", tmp_path / "b", symlinks=True)
    scheme_b = _scheme(tmp_path / "b")
    transaction.recover(scheme_a.purelib, lambda m: None, scheme_a.roots)  # "the repair"
    assert _tree(tmp_path / "a") == before_a
    (scheme_a.purelib / "alpha" / "later.py").write_text("A's own later file")
    a_now, b_now = _tree(tmp_path / "a"), _tree(tmp_path / "b")
    message = _refused(scheme_b)
    assert "another environment" in message
    assert _tree(tmp_path / "a") == a_now and _tree(tmp_path / "b") == b_now


def test_a_journal_for_another_inode_or_id_is_refused(tmp_path: Path) -> None:
    """The same path, but the folder was replaced (restored, recreated) or the id differs."""
    scheme, _ = _killed_install(tmp_path)
    site = scheme.purelib
    data = _journal(site)
    _write_journal(site, {**data, "site_ino": data["site_ino"] + 1})
    assert "another copy" in _refused(scheme)
    _write_journal(site, data)
    (site / transaction.TXN_ID).write_text("0" * 32)
    assert "does not match" in _refused(scheme)
    (site / transaction.TXN_ID).unlink()
    assert "does not match" in _refused(scheme)
    (site / transaction.TXN_ID).write_text(data["txn_id"])
    assert transaction.recover(site, lambda m: None, scheme.roots)
    assert not (site / transaction.TXN_ID).exists()


# --- item 2: the paths a journal names --------------------------------------------------


def _outside_variants(tmp_path: Path, site: Path, env: Path) -> dict[str, dict]:
    victim = str(tmp_path / "victim")
    (site / "link").symlink_to(tmp_path / "victim-dir")
    (site / "info-link.dist-info").symlink_to(tmp_path / "victim-dir")
    return {
        "created-absolute": {"created": [victim]},
        "created-dir": {"created": [str(tmp_path / "victim-dir")]},
        "created-dotdot": {"created": [str(site) + "/../../../../victim"]},
        "created-relative": {"created": ["victim"]},
        "created-via-link": {"created": [str(site / "link" / "f")]},
        "created-env-root": {"created": [str(env)]},
        "saved-outside": {"saved": [[victim, "0"]]},
        "saved-backup-escape": {"saved": [[str(site / "x.py"), "../../../victim"]]},
        "new-dir-outside": {"new_dirs": [str(tmp_path / "victim-dir")]},
        "dist-info-outside": {"dist_infos": [str(tmp_path / "victim-dir")]},
        "dist-info-link": {"dist_infos": [str(site / "info-link.dist-info")]},
        "temp-root-outside": {"temp_roots": [str(tmp_path)]},
        "before-entries-outside": {"before_entries": {str(tmp_path): []}},
        "before-entries-slash": {"before_entries": {str(site): ["../x"]}},
        "root-outside-env": {"created": [str(env.parent / "victim")]},
    }


OUTSIDE_CASES = [
    "created-absolute", "created-dir", "created-dotdot", "created-relative", "created-via-link",
    "created-env-root", "saved-outside", "saved-backup-escape", "new-dir-outside",
    "dist-info-outside", "dist-info-link", "temp-root-outside", "before-entries-outside",
    "before-entries-slash", "root-outside-env",
]  # fmt: skip


@pytest.mark.parametrize("case", OUTSIDE_CASES)
def test_a_journal_naming_paths_outside_the_environment_is_refused(
    tmp_path: Path, case: str
) -> None:
    """The issue's repro (`created: ["/tmp/victim"]` in state commit) and its variants, with
    the tie fields right, so only the path check stands between the journal and the file."""
    scheme, _ = _killed_install(tmp_path)
    site = scheme.purelib
    (tmp_path / "victim").write_text("keep")
    (tmp_path / "victim-dir").mkdir()
    (tmp_path / "victim-dir" / "f").write_text("keep")
    (tmp_path / "victim-dir" / "~tmp").write_text("keep")
    (tmp_path / "~sweep-me").write_text("keep")
    variant = _outside_variants(tmp_path, site, tmp_path / "env")[case]
    _write_journal(site, {**_journal(site), **variant})
    outside = _tree(tmp_path)
    _refused(scheme)
    assert _tree(tmp_path) == outside


def test_the_stage_a_journal_names_is_never_removed(tmp_path: Path) -> None:
    scheme, before = _killed_install(tmp_path)
    site = scheme.purelib
    victim = tmp_path / "greta-stage-victim"
    (victim / "data").mkdir(parents=True)
    _write_journal(site, {**_journal(site), "stage": str(victim)})
    assert transaction.recover(site, lambda m: None, scheme.roots)
    assert (victim / "data").is_dir()
    assert _tree(tmp_path / "env") == before


# --- item 3: bounded, typed reads -------------------------------------------------------


def _damage(site: Path, tmp_path: Path, case: str) -> None:
    txn = site / transaction.TXN_DIR
    journal = txn / transaction.JOURNAL
    good = _journal(site)
    if case == "fifo":
        journal.unlink()
        os.mkfifo(journal)
    elif case == "dev-zero-link":
        journal.unlink()
        journal.symlink_to("/dev/zero")
    elif case == "link-to-valid-journal":
        (tmp_path / "elsewhere.json").write_text(json.dumps(good))
        journal.unlink()
        journal.symlink_to(tmp_path / "elsewhere.json")
    elif case == "sparse-2gb":
        with open(journal, "wb") as fh:
            fh.truncate(2 * 1024**3)
    elif case == "deep-nesting":
        journal.write_text("[" * 200_000 + "]" * 200_000)
    elif case == "directory":
        journal.unlink()
        journal.mkdir()
    elif case == "not-utf8":
        journal.write_bytes(b"\xff\xfe{}")
    elif case == "not-json":
        journal.write_text("{")
    elif case == "a-list":
        _write_journal(site, [good])
    elif case == "old-schema":
        _write_journal(site, {**good, "schema": 1})
    elif case == "unknown-field":
        _write_journal(site, {**good, "run": "rm -rf /"})
    elif case == "missing-field":
        _write_journal(site, {k: v for k, v in good.items() if k != "created"})
    elif case == "unknown-state":
        _write_journal(site, {**good, "state": "rollback"})
    elif case.startswith("type-"):
        field, value = case[5:].split("=")
        _write_journal(site, {**good, field: json.loads(value)})
    elif case == "backup-link":
        shutil.rmtree(txn / "backup")
        (txn / "backup").symlink_to(tmp_path)
    elif case == "txn-symlink":
        real = tmp_path / "real-txn"
        shutil.move(str(txn), str(real))
        txn.symlink_to(real)
    elif case == "txn-plain-file":
        shutil.rmtree(txn)
        txn.write_text("not a folder")
    else:
        raise AssertionError(case)


DAMAGED = [
    "fifo", "dev-zero-link", "link-to-valid-journal", "sparse-2gb", "deep-nesting",
    "directory", "not-utf8", "not-json", "a-list", "old-schema", "unknown-field",
    "missing-field", "unknown-state", "type-created=\"/tmp/x\"", "type-created=[1]",
    "type-saved=[[\"a\"]]", "type-saved={}", "type-pid=\"1\"", "type-pid=true",
    "type-pid=-1", "type-site=null", "type-before_entries=[]",
    "type-before_entries={\"a\":\"b\"}", "type-site_ino=1.5", "type-txn_id=7", "backup-link",
    "txn-symlink", "txn-plain-file",
]  # fmt: skip


@pytest.mark.parametrize("case", DAMAGED)
def test_a_damaged_journal_is_refused_quickly_with_the_command_that_clears_it(
    tmp_path: Path, case: str
) -> None:
    scheme, _ = _killed_install(tmp_path)
    site = scheme.purelib
    _damage(site, tmp_path, case)
    env_now = _tree(tmp_path / "env")
    _refused(scheme)  # returns: no hang on a FIFO, no MemoryError, no RecursionError
    assert _tree(tmp_path / "env") == env_now
    # The command the message names clears it, and the next run goes on normally.
    subprocess.run(
        ["rm", "-rf", "--", str(site / transaction.TXN_DIR), str(site / transaction.TXN_ID)],
        check=True,
    )
    assert transaction.recover(site, lambda m: None, scheme.roots) == []
    assert (tmp_path / "elsewhere.json").exists() or case != "link-to-valid-journal"
    assert (tmp_path / "real-txn").is_dir() or case != "txn-symlink"


def test_a_transaction_folder_without_a_journal_yet_is_discarded(tmp_path: Path) -> None:
    """Killed before its first journal was durable: it changed nothing."""
    scheme, _ = _killed_install(tmp_path)
    site = scheme.purelib
    (site / transaction.TXN_DIR / transaction.JOURNAL).unlink()
    done = transaction.recover(site, lambda m: None, scheme.roots)
    assert done and "no journal yet" in done[0]
    assert not (site / transaction.TXN_DIR).exists() and not (site / transaction.TXN_ID).exists()


# --- the commands: greta env and greta install on such an environment -------------------


def _venv(tmp_path: Path) -> tuple[Path, Path]:
    import venv

    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env)
    site = Path(
        subprocess.run(
            [str(env / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    )  # fmt: skip
    return env, site


def _greta(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "greta", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_greta_env_refuses_the_issue_repro_journal(tmp_path: Path) -> None:
    env, site = _venv(tmp_path)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "f").write_text("keep")
    (site / transaction.TXN_DIR).mkdir()
    repro = {"schema": 1, "state": "commit", "site": "x", "stage": None,
             "created": [str(victim)], "saved": [], "new_dirs": [], "dist_infos": [],
             "temp_roots": [], "before_entries": {}, "pid": 1}  # fmt: skip
    _write_journal(site, repro)
    proc = _greta("env", "--python", str(env / "bin" / "python"))
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr and "rm -rf --" in proc.stderr, proc.stderr
    assert (victim / "f").read_text() == "keep"
    # The same journal tied to this environment (the right site, inode and id) still
    # names a path outside it.
    info = os.stat(site)
    (site / transaction.TXN_ID).write_text("a" * 32)
    _write_journal(site, {**repro, "schema": 2, "site": str(site), "site_dev": info.st_dev,
                          "site_ino": info.st_ino, "txn_id": "a" * 32})  # fmt: skip
    proc = _greta("env", "--python", str(env / "bin" / "python"))
    assert proc.returncode != 0 and "outside this environment" in proc.stderr, proc.stderr
    assert (victim / "f").read_text() == "keep"
