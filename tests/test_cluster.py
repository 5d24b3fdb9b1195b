"""Cluster installs: one node installs and saves a wheelhouse; the others install the very
same bytes from it, offline (the package index they are given is dead)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _install_helpers import (
    PY,
    REPO,
    Index,
    copy_venv,
    create_venv,
    make_wheel,
    python_of,
    snapshot,
)

from greta_install.locks.lockfile import Lock, LockedPackage, format_lock

pytestmark = pytest.mark.slow

WHEELS = dict([make_wheel("alpha-pkg", "1.0"), make_wheel("vendor-pkg", "1.0", 8)])


def _env(index_url: str, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env.update(
        PIP_CONFIG_FILE=os.devnull,
        PIP_INDEX_URL=index_url,
        PIP_NO_CACHE_DIR="1",
        PIP_RETRIES="0",
        PIP_TIMEOUT="5",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PYTHONPATH=str(REPO),
        GRETA_KERNEL_INDEX="",
        GRETA_HASH_RECORD=str(tmp_path / "user-hashes.json"),
        TMPDIR=str(tmp_path / "tmp"),
    )
    (tmp_path / "tmp").mkdir(parents=True, exist_ok=True)
    return env


def test_wheelhouse_gives_other_nodes_the_same_bytes_offline(tmp_path: Path) -> None:
    alpha = next(n for n in WHEELS if n.startswith("alpha"))
    lock = Lock(
        target="cpu",
        python=PY,
        packages=(
            LockedPackage("alpha-pkg", "1.0", None, ("sha256:" + hashlib.sha256(WHEELS[alpha]).hexdigest(),)),
            LockedPackage("vendor-pkg", "1.0", None, ()),  # no hash anywhere: first use
        ),
        kernel_wheel=None,
        env={},
        meta={"target": "cpu", "python": PY},
    )  # fmt: skip
    path = tmp_path / "lock.txt"
    path.write_text(format_lock(lock), encoding="utf-8")
    template = create_venv(tmp_path / "template")
    node1 = copy_venv(template, tmp_path / "node1")
    node2 = copy_venv(template, tmp_path / "node2")
    house = tmp_path / "wheelhouse"

    def install(venv: Path, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "greta", "install", "--lock", str(path),
                "--python", python_of(venv), "--force-target", "--installer", "pip",
                *extra]  # fmt: skip
        return subprocess.run(
            argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False
        )

    with Index(WHEELS, {}) as index:
        first = install(node1, _env(index.url, tmp_path / "n1"), "--save-wheelhouse", str(house))
    assert first.returncode == 0, first.stdout + first.stderr
    record = json.loads((house / "greta-hashes.json").read_text())
    assert set(record["files"]) == set(WHEELS)
    # Node 2 gets a dead index: everything must come from the wheelhouse.
    dead = "http://127.0.0.1:9/simple/"
    second = install(node2, _env(dead, tmp_path / "n2"), "--from-record", str(house), "--strict")
    assert second.returncode == 0, second.stdout + second.stderr
    site1 = {k.split("site-packages/", 1)[-1]: v for k, v in snapshot(node1).items() if "_pkg" in k}
    site2 = {k.split("site-packages/", 1)[-1]: v for k, v in snapshot(node2).items() if "_pkg" in k}
    assert site1 == site2 and site1
