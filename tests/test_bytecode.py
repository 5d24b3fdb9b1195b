"""Bytecode after an install, and the doctor's python.bytecode check (issue 28, item 1)."""

from __future__ import annotations

import py_compile
import sys
import zipfile
from pathlib import Path

import pytest

from greta_install.doctor.checks import CHECKS
from greta_install.doctor.facts import Facts, PythonInfo
from greta_install.doctor.runner import run_check
from greta_install.environment import bytecode

BY_ID = {c.id: c for c in CHECKS}


def _package(root: Path, name: str, modules: int) -> list[Path]:
    pkg = root / name
    pkg.mkdir()
    files = [pkg / "__init__.py", *(pkg / f"m{i}.py" for i in range(modules - 1))]
    for f in files:
        f.write_text("X = 1\n", encoding="utf-8")
    return files


def test_package_state_counts_compiled_modules(tmp_path: Path, monkeypatch) -> None:
    files = _package(tmp_path, "fakefw", 4)
    monkeypatch.syspath_prepend(str(tmp_path))
    before = bytecode.package_state("fakefw")
    assert before is not None and (before.modules, before.compiled) == (4, 0)
    assert before.missing
    for f in files[:3]:
        py_compile.compile(str(f))
    after = bytecode.package_state("fakefw")
    assert after is not None and (after.modules, after.compiled) == (4, 3)
    assert not after.missing
    assert "fakefw" not in sys.modules  # looked at on disk, never imported
    assert bytecode.package_state("no_such_package_greta_test") is None


def test_the_install_compiles_the_files_its_wheels_wrote(tmp_path: Path, monkeypatch) -> None:
    from _install_helpers import make_wheel

    extra = {
        "fakefw2/broken.py": b"def (:\n",
        # its own test suite: never imported by a program, not compiled
        "fakefw2/tests/test_a.py": b"Z = 3\n",
        "fakefw2/sub/test/test_b.py": b"Z = 4\n",
        "fakefw2/testing.py": b"Z = 5\n",  # a module, not a test folder
    }
    filename, data = make_wheel("fakefw2", "1.0", extra=extra)
    wheel = tmp_path / filename
    wheel.write_bytes(data)
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    (site / "other.py").write_text("Y = 2\n", encoding="utf-8")  # not the install's
    sources = bytecode.installed_sources([wheel], site)
    assert sorted(p.name for p in sources) == ["__init__.py", "broken.py", "testing.py"]
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    assert bytecode.compile_installed(sys.executable, sources) is None  # broken.py: no failure
    monkeypatch.syspath_prepend(str(site))
    state = bytecode.package_state("fakefw2")
    assert state is not None and (state.modules, state.compiled) == (5, 2)
    assert not (site / "__pycache__").exists()  # other.py was left alone


def _facts(states: dict[str, bytecode.BytecodeState], env: dict[str, str]) -> Facts:
    facts = Facts(live=True, env=env)
    facts.python = PythonInfo(
        version="3.11.7",
        executable="/venv/bin/python",
        prefix="/venv",
        base_prefix="/usr",
        site_packages="/venv/lib/python3.11/site-packages",
    )
    facts.bytecode = states
    return facts


@pytest.mark.parametrize("dont_write", [False, True])
def test_doctor_warns_about_a_missing_bytecode_environment(dont_write: bool) -> None:
    env = {"PYTHONDONTWRITEBYTECODE": "1"} if dont_write else {}
    states = {
        "torch": bytecode.BytecodeState("torch", 3500, 120),
        "jax": bytecode.BytecodeState("jax", 900, 900),
    }
    result = run_check(BY_ID["python.bytecode"], _facts(states, env))
    assert result.status == "warn", result
    assert "torch (120/3500 modules)" in result.finding and "jax" not in result.finding
    assert ("PYTHONDONTWRITEBYTECODE" in result.finding) is dont_write
    assert result.fix == (
        "/venv/bin/python -m compileall -qq -j 0 /venv/lib/python3.11/site-packages"
    )


def test_doctor_bytecode_ok_when_compiled() -> None:
    states = {"torch": bytecode.BytecodeState("torch", 3500, 3490)}
    result = run_check(BY_ID["python.bytecode"], _facts(states, {}))
    assert result.status == "ok" and "torch (3490/3500)" in result.finding
