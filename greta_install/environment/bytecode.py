"""Bytecode for the installed frameworks: compiled once after the commit, checked by the doctor.

The offline install step runs with `pip install --no-compile` (uv compiles nothing by
default either) so the transaction's file list is exactly the wheels' files. Without
bytecode every `import torch` compiles thousands of modules again, and in containers with
PYTHONDONTWRITEBYTECODE=1 it never stops doing so. The install therefore compiles
the files it installed once the commit has finished, and the doctor's `python.bytecode`
check reports an environment that has none.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# The frameworks whose import time a missing cache hurts (torch: ~3,500 modules).
FRAMEWORKS: tuple[str, ...] = ("torch", "triton", "jax")
# Below this share of compiled modules a package counts as "without bytecode": a first
# import writes the cache of the modules it touched only, which is well under half.
COMPILED_SHARE = 0.5
COMPILE_TIMEOUT_S = 900.0
# Folders of a package's own test suite (sympy's, scipy's, numpy's, networkx's in the cpu
# row): no program imports them, so compiling them only lengthened every install.
TEST_FOLDERS = frozenset({"tests", "test"})


def compile_argv(python: str) -> list[str]:
    """compileall of the files named on stdin, on every core, quiet. `-I`: the target's own
    compileall, not one the current directory could shadow."""
    return [python, "-I", "-m", "compileall", "-qq", "-j", "0", "-i", "-"]


def installed_sources(wheels: Iterable[Path], site: Path) -> list[Path]:
    """The .py files the install wrote into `site`, read from the wheels it installed
    (files under `<name>.data/purelib|platlib/` land in site too; scripts do not), less
    those in a package's own test folders (TEST_FOLDERS)."""
    found: list[Path] = []
    for wheel in wheels:
        if wheel.suffix != ".whl":
            continue
        with zipfile.ZipFile(wheel) as archive:
            for name in archive.namelist():
                if not name.endswith(".py"):
                    continue
                top, _, rest = name.partition("/")
                if top.endswith(".data"):
                    scheme, _, rest = rest.partition("/")
                    if scheme not in ("purelib", "platlib"):
                        continue
                    name = rest
                if TEST_FOLDERS.intersection(name.split("/")[1:-1]):
                    continue
                found.append(site / name)
    return found


def compile_installed(python: str, sources: Iterable[Path]) -> str | None:
    """Compile the installed sources; None on success, else why not (the install stays
    valid: bytecode only saves time)."""
    listing = "".join(f"{p}\n" for p in sources if p.is_file())
    if not listing:
        return None
    try:
        proc = subprocess.run(
            compile_argv(python),
            input=listing,
            capture_output=True,
            text=True,
            timeout=COMPILE_TIMEOUT_S,
            check=False,
            cwd="/",
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"compiling bytecode failed: {exc}"
    # compileall exits 1 when any file fails to compile; wheels ship such files on purpose
    # (templates, test data in other Python versions' syntax). The rest is compiled.
    return None if proc.returncode in (0, 1) else f"compileall exited {proc.returncode}"


@dataclass(frozen=True)
class BytecodeState:
    package: str
    modules: int  # .py files in the package
    compiled: int  # of them, those with a current-interpreter .pyc in __pycache__

    @property
    def missing(self) -> bool:
        return self.modules > 0 and self.compiled < COMPILED_SHARE * self.modules


def package_state(package: str) -> BytecodeState | None:
    """How much of an installed package has bytecode; None when it is not installed.
    Reads the file system only: the package is not imported."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    modules = compiled = 0
    for root in spec.submodule_search_locations:
        for source in _sources(Path(root)):
            modules += 1
            if os.path.exists(importlib.util.cache_from_source(str(source))):
                compiled += 1
    return BytecodeState(package, modules, compiled)


def _sources(root: Path) -> Iterable[Path]:
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if name.endswith(".py"):
                yield Path(folder) / name
