"""greta_install.rollback on a hand-made environment: what an installer that fails midway
leaves behind (one package replaced, one new, one untouched) is undone file by file."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from greta_install import rollback


def _dist(site: Path, name: str, version: str, files: dict[str, str]) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n")
    rows = [f"{info.name}/METADATA,,", f"{info.name}/RECORD,,"]
    for rel, text in files.items():
        path = Path(site, rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        rows.append(f"{rel},,")
    (info / "RECORD").write_text("\n".join(rows) + "\n")


def _state(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".greta-rollback-" not in str(p)
    }


def _env(tmp_path: Path) -> Path:
    site = tmp_path / "env" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (tmp_path / "env" / "bin").mkdir()
    _dist(site, "alpha", "1.0", {"alpha/__init__.py": "v1", "../../../bin/alpha": "#!v1"})
    _dist(site, "other", "3.0", {"other.py": "untouched"})
    return site


def _uninstall(site: Path, name: str, version: str) -> None:
    info = site / f"{name}-{version}.dist-info"
    for path in rollback.record_files(info, rollback.env_root(site)):
        path.unlink()
    shutil.rmtree(info, ignore_errors=True)


def test_a_failed_install_is_undone(tmp_path: Path) -> None:
    site = _env(tmp_path)
    env = tmp_path / "env"
    before = _state(env)
    saved = rollback.backup(site, ["Alpha", "beta"])  # names as the lock spells them
    assert len(saved.saved) == 4  # alpha's module, script, METADATA, RECORD; not other's
    # The installer replaced alpha, installed beta, then died before finishing.
    _uninstall(site, "alpha", "1.0")
    _dist(
        site,
        "alpha",
        "2.0",
        {"alpha/__init__.py": "v2", "alpha/new.py": "new", "../../../bin/alpha": "#!v2"},
    )
    _dist(site, "beta", "1.0", {"beta/__init__.py": "b"})
    assert _state(env) != before
    done = rollback.restore(saved)
    rollback.discard(saved)
    assert _state(env) == before
    assert not (site / "beta").exists() and not list(site.parent.glob(".greta-rollback-*"))
    assert done == ["removed alpha-2.0 (5 files)", "removed beta-1.0 (3 files)",
                    "put back 4 files of the replaced versions"]  # fmt: skip


def test_nothing_changed_nothing_done(tmp_path: Path) -> None:
    site = _env(tmp_path)
    before = _state(tmp_path / "env")
    saved = rollback.backup(site, ["alpha"])
    assert rollback.restore(saved) == []
    rollback.discard(saved)
    assert _state(tmp_path / "env") == before


def test_record_never_reaches_outside_the_environment(tmp_path: Path) -> None:
    site = _env(tmp_path)
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me")
    info = site / "alpha-1.0.dist-info"
    (info / "RECORD").write_text((info / "RECORD").read_text() + "../../../../precious.txt,,\n")
    files = rollback.record_files(info, rollback.env_root(site))
    assert outside not in files and len(files) == 4
    # A new distribution whose RECORD points outside: restore leaves that file alone.
    saved = rollback.backup(site, [])
    _dist(site, "evil", "1.0", {"evil.py": "x"})
    evil = site / "evil-1.0.dist-info"
    (evil / "RECORD").write_text((evil / "RECORD").read_text() + "../../../../precious.txt,,\n")
    rollback.restore(saved)
    rollback.discard(saved)
    assert outside.read_text() == "keep me" and not (site / "evil.py").exists()
