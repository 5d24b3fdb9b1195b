"""Result files name the code that ran: a copied checkout (the lent GPU machines get one) can
hold a HEAD older than its files, so the metadata carries the files' own git tree, which
equals ``git rev-parse C^{tree}`` of the commit C whose files they are."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from greta_core.bench.metadata import git_commit

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(repo: Path, *args: str) -> str:
    cmd = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    return subprocess.run(
        [*cmd, *args], cwd=repo, check=True, capture_output=True, text=True
    ).stdout.strip()


def _commit(repo: Path, files: dict[str, str]) -> str:
    for name, text in files.items():
        (repo / name).write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "c")
    return _git(repo, "rev-parse", "HEAD")


def test_a_stale_head_still_names_the_files_tree(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / ".gitignore").write_text("ignored/\n")
    old = _commit(repo, {"a.py": "1\n"})
    assert git_commit(repo) == {
        "commit": old, "dirty": False, "tree": _git(repo, "rev-parse", "HEAD^{tree}")
    }  # fmt: skip

    # A later commit's files copied over the old checkout: edited, added, and an ignored one.
    newer = tmp_path / "newer"
    shutil.copytree(repo, newer)
    new = _commit(newer, {"a.py": "2\n", "b.py": "3\n"})
    for name in ("a.py", "b.py"):
        shutil.copy(newer / name, repo / name)
    (repo / "ignored").mkdir()
    (repo / "ignored" / "x").write_text("not code\n")
    status = _git(repo, "status", "--porcelain")

    got = git_commit(repo)
    assert got["commit"] == old and got["dirty"] is True
    assert got["tree"] == _git(newer, "rev-parse", f"{new}^{{tree}}")
    assert _git(repo, "status", "--porcelain") == status  # its own index untouched
