"""What a new user met in their first hour (issue 28), each with a test."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import venv
from pathlib import Path

from _install_helpers import REPO


def _deps_dir(tmp_path: Path) -> Path:
    """The installer half's own dependencies and nothing else (no pip, no uv)."""
    deps = tmp_path / "deps"
    deps.mkdir()
    for name in ("packaging", "platformdirs"):
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.submodule_search_locations
        (deps / name).symlink_to(spec.submodule_search_locations[0])
    return deps


def test_a_venv_without_pip_or_uv_fails_before_downloading_with_the_fix(tmp_path: Path) -> None:
    env_dir = tmp_path / "uv-made"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env_dir)
    python = str(env_dir / "bin" / "python")
    env = {
        "PATH": "/usr/bin:/bin",  # no uv anywhere on it
        "PYTHONPATH": f"{REPO}{os.pathsep}{_deps_dir(tmp_path)}",
        "HOME": str(tmp_path),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    for argv in (["--dry-run"], []):
        proc = subprocess.run(
            [python, "-m", "greta", "install", "--target", "cpu", *argv],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=300,
            check=False,
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode == 2, out
        assert f"`{python} -m ensurepip`" in out and "no uv was found" in out, out
        assert "staging" not in out and "downloading" not in out, out
    assert not list((env_dir / "lib").glob("python3*/site-packages/torch*"))
