"""No GRETA command imports from the current directory (issue 30, items 4 and 9).

Each command runs from a directory holding hostile `greta`, `greta_core`, `greta_install`,
`pip`, `triton`, `torch` and `jax` packages and a `sitecustomize.py`; every one of them
records its import in a marker file. GRETA is started as its console script is (its own
code from the environment, the cwd on no path), so anything that lands in the marker came
from a child process GRETA started."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from _install_helpers import make_wheel, pip_venv, python_of

from greta_install import commandline
from greta_install.locks.lockfile import load_lock, lock_resource_dir

HOSTILE = ("greta", "greta_core", "greta_install", "pip", "triton", "torch", "jax")
# `greta` as the console script starts it: the installed package, no cwd on sys.path.
GRETA = [sys.executable, "-I", "-c", "import sys; from greta.cli import main; sys.exit(main())"]


@pytest.fixture
def hostile(tmp_path: Path) -> tuple[Path, Path]:
    """(directory, marker): importing anything from the directory appends to the marker."""
    where = tmp_path / "hostile"
    marker = tmp_path / "PWNED"
    code = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
    for name in HOSTILE:
        (where / name).mkdir(parents=True)
        (where / name / "__init__.py").write_text(code)
        (where / name / "__main__.py").write_text(code)
    (where / "sitecustomize.py").write_text(code)
    (where / "usercustomize.py").write_text(code)
    return where, marker


def _bare_venv(path: Path) -> str:
    venv.EnvBuilder(with_pip=False, symlinks=True).create(path)
    return str(path / "bin" / "python")


def _greta(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "GRETA_"))}
    return subprocess.run(
        [*GRETA, *args], cwd=cwd, env={**clean, **env}, capture_output=True, text=True,
        timeout=600, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _nothing_ran(marker: Path) -> None:
    assert not marker.exists(), f"imported from the cwd: {marker.read_text()}"


def test_the_hostile_directory_is_live(hostile: tuple[Path, Path]) -> None:
    """The fixture's packages do run when a child puts the cwd on its path (the old
    `python -m` children did): the tests below can fail."""
    where, marker = hostile
    subprocess.run([sys.executable, "-m", "greta_core"], cwd=where, check=False)
    assert "greta_core" in marker.read_text().split()


def test_greta_child_runs_this_greta_isolated(hostile: tuple[Path, Path]) -> None:
    where, marker = hostile
    argv = commandline.greta_child("greta", "--help")
    proc = subprocess.run(
        argv, cwd=where, capture_output=True, text=True, check=False, timeout=120,
        env={**os.environ, "PYTHONPATH": str(where)},
    )  # fmt: skip
    assert proc.returncode == 0 and "usage: greta" in proc.stdout, proc.stderr
    _nothing_ran(marker)


def test_kernels_and_install_only_kernels_read_triton_in_isolation(
    hostile: tuple[Path, Path], tmp_path: Path
) -> None:
    """The Triton fingerprint child (`from greta_core…`) of `greta kernels` and of
    `greta install --only kernels`: in a bare environment (no greta_core, no triton) it
    fails cleanly instead of importing the cwd's."""
    where, marker = hostile
    python = _bare_venv(tmp_path / "bare")
    cache = str(tmp_path / "cache")
    proc = _greta(where, "kernels", "--arch", "sm_90", "--python", python, GRETA_KERNEL_CACHE=cache)
    assert proc.returncode != 0 and "No module named 'greta_core'" in proc.stderr, proc.stderr
    proc = _greta(where, "install", "--only", "kernels", "--target", "cuda", "--arch", "sm_90",
                  "--python", python, GRETA_KERNEL_CACHE=cache)  # fmt: skip
    assert proc.returncode != 0 and "No module named 'greta_core'" in proc.stderr + proc.stdout
    _nothing_ran(marker)


def test_build_kernels_and_warm_children_run_the_installed_greta(
    hostile: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`python -m greta build-kernels` (the install's kernel-build step) and `python -m greta
    warm` (`--only kernels`), started from the hostile directory: the real GRETA answers."""
    from greta_install.install import kernel_build
    from greta_install.install import only as install_only

    where, marker = hostile
    monkeypatch.chdir(where)
    with pytest.raises(kernel_build.KernelBuildError) as info:
        kernel_build._run_with_progress(
            kernel_build.build_argv(sys.executable, "bogus", str(where / "out")),
            {**os.environ, "PYTHONPATH": str(where)}, "bogus", lambda m: None, 300,
        )  # fmt: skip
    assert "bogus" in str(info.value) and "Traceback" not in str(info.value)
    said: list[str] = []
    assert install_only._warm(sys.executable, said.append) is True, said
    _nothing_ran(marker)


def test_the_aot_reexec_runs_the_installed_module(hostile: tuple[Path, Path]) -> None:
    """Under TRITON_INTERPRET=1 the AOT compiler re-executes itself in a child."""
    where, marker = hostile
    code = (
        "import sys; from greta_core.kernel_wheels.aot import main; "
        "sys.exit(main(['--arch', 'bogus', '--report', 'r.json']))"
    )
    proc = subprocess.run(
        [sys.executable, "-I", "-c", code], cwd=where, capture_output=True, text=True,
        env={**os.environ, "TRITON_INTERPRET": "1"}, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and "bogus" in proc.stderr, proc.stderr
    _nothing_ran(marker)


def test_uninstall_runs_the_environments_own_pip(
    hostile: tuple[Path, Path], tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The issue's repro: a fake pip in the cwd ran and a still-installed kernel wheel
    was reported as uninstalled."""
    where, marker = hostile
    python = python_of(pip_venv(tmp_path_factory, tmp_path / "env"))
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())  # fmt: skip
    info = site / "greta_kernels_sm_90-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: greta-kernels-sm-90\nVersion: 0.1.0\n"
    )
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text(
        "greta_kernels_sm_90-0.1.0.dist-info/METADATA,,\n"
        "greta_kernels_sm_90-0.1.0.dist-info/INSTALLER,,\n"
        "greta_kernels_sm_90-0.1.0.dist-info/RECORD,,\n"
    )
    proc = _greta(where, "uninstall", "--python", python)
    assert proc.returncode == 0, proc.stderr
    assert "uninstalled greta-kernels-sm-90" in proc.stdout and not info.exists()
    _nothing_ran(marker)


def _stand_in_wheels(folder: Path) -> Path:
    """A stand-in wheel for every pin of every packaged lock of this Python: pip finds each
    pin in this folder at once, whichever target the doctor detects here."""
    py = f"{sys.version_info[0]}.{sys.version_info[1]}"
    folder.mkdir()
    for entry in (lock_resource_dir() / "targets").iterdir():
        target, found, row = entry.name.removesuffix(".txt").partition(f"-py{py.replace('.', '')}")
        if not found:
            continue
        for pkg in load_lock(target, py, row.lstrip("-") or "current").packages:
            filename, data = make_wheel(str(pkg.name), str(pkg.version))
            (folder / filename).write_bytes(data)
    return folder


def test_doctor_and_its_index_check_run_isolated(
    hostile: tuple[Path, Path], tmp_path: Path
) -> None:
    """`greta doctor --check-index`: the framework probes, the backend probe
    (`greta_core.backends`) and `pip install --dry-run` against an index (a folder of
    stand-in wheels, no machine's pip configuration: every pin is found, so pip runs once
    per index of the lock instead of once more for each pin it did not find)."""
    where, marker = hostile
    proc = _greta(
        where, "doctor", "--check-index", "--json", PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1",
        PIP_FIND_LINKS=str(_stand_in_wheels(tmp_path / "wheels")),
    )  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr
    assert '"backends' in proc.stdout, proc.stdout[-2000:]
    (index,) = [c for c in json.loads(proc.stdout)["checks"] if c["id"] == "lock.index"]
    assert index["status"] == "ok", index  # pip ran and answered
    _nothing_ran(marker)


def test_a_relative_python_works(tmp_path: Path) -> None:
    """Item 9: `--python venv/bin/python` was run from / by the children."""
    _bare_venv(tmp_path / "venv")
    proc = _greta(tmp_path, "env", "--python", "venv/bin/python")
    assert proc.returncode == 0, proc.stderr
    assert "no GRETA environment fixes are installed in" in proc.stderr
    assert commandline.interpreter_path("venv/bin/python") == str(Path.cwd() / "venv/bin/python")
    assert commandline.interpreter_path("python3") == "python3"
