"""The ptxas XLA finds first, and the one the environment's NVIDIA wheels bring.

jax-triton hands XLA the PTX Triton wrote, and XLA assembles it with the first ptxas it
finds: on a machine with a system CUDA toolkit that is the toolkit's (PATH, or
/usr/local/cuda/bin), not the locked `nvidia-cuda-nvcc` wheel's. Triton 3.9 writes PTX
ISA 9.4, which CUDA 13.0's ptxas refuses ("Unsupported .version 9.4; current version is
'9.0'"), measured on the lent H200; with the wheel's directory first on PATH it passed.
torch is not affected: Triton runs the ptxas it ships itself.

The doctor (check `cuda.ptxas`), the smoke test's message and scripts/gpu_suite.sh all
read the wheel's directory from here. Parsing is pure; `probe`, `collect` and
`site_dirs_of` are the side effects (a `ptxas --version` subprocess, the disk).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# Where NVIDIA's wheels put ptxas, relative to site-packages: the CUDA 13 wheels share
# nvidia/cu13/, the CUDA 12 ones had one folder per component. cuda.pathfinder (a locked
# dependency) knows both too, but its search goes on to CUDA_HOME and Conda, so it can
# answer with the very toolkit ptxas this comparison is about: the layout is read here.
WHEEL_BIN_DIRS = ("nvidia/cu13/bin", "nvidia/cuda_nvcc/bin")
# Where XLA looks when PATH has no ptxas (the usual CUDA toolkit location).
TOOLKIT_BIN = "/usr/local/cuda/bin"
VERSION_TIMEOUT_S = 10.0
# What XLA's error says when ptxas is older than the PTX it is given.
UNSUPPORTED_PTX = "Unsupported .version"

_RELEASE = re.compile(r"\brelease (\d+)\.(\d+)\b")
_BUILD = re.compile(r"\bBuild cuda_(\d+)\.(\d+)")


def parse_version(text: str) -> tuple[int, int] | None:
    """(13, 5) from `ptxas --version` output ("Cuda compilation tools, release 13.5,
    V13.5.37" or "Build cuda_13.5.r13.5/compiler..."); None when neither line is there."""
    match = _RELEASE.search(text) or _BUILD.search(text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def version_text(version: tuple[int, int] | None) -> str:
    return f"CUDA {version[0]}.{version[1]}" if version else "version unknown"


def export_line(directory: str) -> str:
    """`export PATH="DIR:$PATH"`, DIR escaped for the double quotes ($PATH must expand)."""
    escaped = re.sub(r'(["\\$`])', r"\\\1", directory)
    return f'export PATH="{escaped}:$PATH"'


@dataclass(frozen=True)
class Ptxas:
    path: str
    version: tuple[int, int] | None
    error: str | None = None  # why the version is unknown: not run, timed out, unrecognised

    @property
    def described(self) -> str:
        return f"{self.path} ({version_text(self.version)})"


@dataclass(frozen=True)
class PtxasFacts:
    first: Ptxas | None  # the first ptxas on PATH
    toolkit: Ptxas | None  # TOOLKIT_BIN's, looked at only when PATH has none
    wheel: Ptxas | None  # the one from the environment's NVIDIA wheels
    searched: tuple[str, ...]  # the wheel folders looked in, for an honest "not found"
    first_is_wheel: bool = False  # PATH's first ptxas is the wheel's file (or a link to it)

    @property
    def competitor(self) -> Ptxas | None:
        """The ptxas XLA runs before it could reach the wheel's."""
        return self.first or self.toolkit

    @property
    def wheel_dir(self) -> str | None:
        return str(Path(self.wheel.path).parent) if self.wheel else None


def wheel_ptxas(site_dirs: Iterable[Path]) -> Path | None:
    """The first executable ptxas under WHEEL_BIN_DIRS of the given site-packages folders."""
    for site in site_dirs:
        for rel in WHEEL_BIN_DIRS:
            candidate = Path(site) / rel / "ptxas"
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return candidate
    return None


def searched_dirs(site_dirs: Iterable[Path]) -> tuple[str, ...]:
    return tuple(str(Path(site) / rel) for site in site_dirs for rel in WHEEL_BIN_DIRS)


def probe(path: str, timeout: float = VERSION_TIMEOUT_S) -> Ptxas:
    """`path --version`, read; never raises."""
    try:
        proc = subprocess.run(
            [path, "--version"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return Ptxas(path, None, f"`ptxas --version` did not answer in {timeout:g} s")
    except OSError as exc:
        return Ptxas(path, None, f"could not run it: {exc.strerror or exc}")
    output = (proc.stdout or "") + (proc.stderr or "")
    version = parse_version(output)
    if version is not None:
        return Ptxas(path, version)
    lines = output.strip().splitlines()
    said = lines[-1][:160] if lines else "nothing"
    return Ptxas(path, None, f"`ptxas --version` exited {proc.returncode} and printed {said!r}")


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def collect(
    site_dirs: Iterable[Path],
    path_env: str | None = None,
    toolkit_bin: str = TOOLKIT_BIN,
    timeout: float = VERSION_TIMEOUT_S,
) -> PtxasFacts:
    """The ptxas on PATH (`path_env`; this process's PATH when None), the toolkit's when PATH
    has none, and the wheel's, each with its version."""
    sites = list(dict.fromkeys(Path(s) for s in site_dirs))
    found = shutil.which("ptxas", path=path_env if path_env is not None else os.environ.get("PATH"))
    wheel_path = wheel_ptxas(sites)
    wheel = probe(str(wheel_path), timeout) if wheel_path else None
    first = None
    first_is_wheel = bool(found and wheel and _same_file(found, wheel.path))
    if found:
        # The wheel's own ptxas first on PATH needs no second run.
        ran = wheel if first_is_wheel and wheel else probe(found, timeout)
        first = Ptxas(found, ran.version, ran.error)
    toolkit = None
    toolkit_ptxas = Path(toolkit_bin) / "ptxas"
    if first is None and toolkit_ptxas.is_file() and os.access(toolkit_ptxas, os.X_OK):
        toolkit = probe(str(toolkit_ptxas), timeout)
    return PtxasFacts(first, toolkit, wheel, searched_dirs(sites), first_is_wheel)


def this_site_dirs() -> list[Path]:
    paths = sysconfig.get_paths()
    return [Path(p) for p in dict.fromkeys((paths["purelib"], paths["platlib"]))]


def site_dirs_of(python: str, timeout: float = 60.0) -> list[Path]:
    """purelib and platlib of the interpreter `python` ([] when it cannot be asked)."""
    code = "import sysconfig as s; p = s.get_paths(); print(p['purelib']); print(p['platlib'])"
    try:
        proc = subprocess.run(
            [python, "-I", "-c", code],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
            cwd="/",
        )
    except (OSError, subprocess.SubprocessError):
        return []
    if proc.returncode != 0:
        return []
    return [Path(line) for line in dict.fromkeys(proc.stdout.splitlines()) if line.strip()]


def main(argv: list[str]) -> int:
    """`python -m greta_install.environment.ptxas --wheel-dir`: the wheel's ptxas folder
    of this interpreter's environment (exit 1, nothing printed, when it has none)."""
    if argv != ["--wheel-dir"]:
        print("usage: python -m greta_install.environment.ptxas --wheel-dir", file=sys.stderr)
        return 2
    found = wheel_ptxas(this_site_dirs())
    if found is None:
        return 1
    print(found.parent)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
