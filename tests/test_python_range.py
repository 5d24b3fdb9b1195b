"""The Python range: requires-python says what the locks cover, and an interpreter outside
it gets one line naming the fix before anything is downloaded."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.specifiers import SpecifierSet

from greta_install.locks.lockfile import lock_filename
from greta_install.locks.matrix import load_matrix

REPO = Path(__file__).resolve().parents[1]
MATRIX = load_matrix()


def test_requires_python_is_exactly_the_matrix_range() -> None:
    spec = SpecifierSet(
        tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    )
    pythons = sorted(MATRIX.pythons, key=lambda v: int(v.split(".")[1]))
    assert pythons == ["3.11", "3.12", "3.13"]
    for py in pythons:
        assert spec.contains(f"{py}.0")
    lowest, highest = (int(pythons[i].split(".")[1]) for i in (0, -1))
    assert not spec.contains(f"3.{lowest - 1}.0") and not spec.contains(f"3.{highest + 1}.0")


def test_every_target_has_a_lock_for_every_python() -> None:
    for row in MATRIX.rows():
        assert (
            REPO / "lock" / "targets" / lock_filename(row.target, row.python, row.generation)
        ).is_file()


@pytest.mark.parametrize("python", ["3.10", "3.14"])
def test_an_uncovered_python_gets_one_line_with_the_fix(python: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "greta", "install", "--dry-run", "--target", "cpu", "--python", python],
        capture_output=True, text=True, cwd=REPO, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert f"Python {python} is not covered" in line and "-m venv" in line
