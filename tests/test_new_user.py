"""What a new user tripped on (issue 10, point 7), each with a test.

- a `uv venv` has no pip: downloads then run pip through uv, no "No module named pip";
- fixes never say `pip install greta` (the public name is another project);
- `greta uninstall` removes greta-env.pth and the rest, so nothing keeps exporting;
- an environment that already matches the lock: "nothing to do", no downloads;
- (dry run exit status and vendor downloads: tests/test_plan.py; vendor preflight with
  the DNS error: tests/test_hash_policy.py; progress of long steps: kernel build and
  smoke test print per step, tests/test_kernel_build.py and tests/test_smoke.py).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from _install_helpers import REPO, copy_venv, create_venv, python_of

from greta_install.commands import uninstall
from greta_install.environment import envfix
from greta_install.install import hashrecord
from greta_install.install.installer import downloader_for
from greta_install.plan import noop
from greta_install.plan.install_plan import InstallPlan, KernelWheel, PlannedPackage


def test_pip_less_uv_venv_downloads_with_pip_run_by_uv() -> None:
    d = downloader_for(
        "/env/bin/python",
        "3.12",
        "x86_64-manylinux_2_28",
        False,
        uv="/usr/bin/uv",
        here_has_pip=False,
    )
    assert d.argv()[:6] == ["/usr/bin/uv", "tool", "run", "--from", "pip", "pip"]
    assert "--python-version" in d.argv() and "3.12" in d.argv()  # the target's tags
    # With pip here, this interpreter's pip is used as before.
    mine = downloader_for(
        "/env/bin/python",
        "3.12",
        "x86_64-manylinux_2_28",
        False,
        uv="/usr/bin/uv",
        here_has_pip=True,
    )
    assert mine.argv()[0] == sys.executable


def test_no_fix_or_message_says_pip_install_greta() -> None:
    bad = []
    paths = [
        *(REPO / "greta_install").rglob("*.py"),
        *(REPO / "docs").rglob("*.md"),
        REPO / "README.md",
    ]
    for path in paths:
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"pip install greta(?![-_\w])", line) and "never" not in line:
                bad.append(f"{path.relative_to(REPO)}:{lineno}: {line.strip()}")
    assert bad == []


def _plan(env: dict[str, str]) -> InstallPlan:
    return InstallPlan(
        target="cpu", arch=None, kernel_arch=None, python_version="3.12",
        python_executable="python", installer="pip", lock_file="cpu-py312.txt",
        platform="x86_64-manylinux_2_28",
        packages=[PlannedPackage("torch", "2.13.0+cpu", None, ()), PlannedPackage("numpy", "2.4.6", None, ())],
        kernel_wheel=KernelWheel(None, None, "none", None, None, "none"),
        env=env, env_why={}, warnings=[], allow_unverified=False,
    )  # fmt: skip


def test_nothing_to_do_only_when_everything_matches() -> None:
    plan = _plan({"TRITON_INTERPRET": "1"})
    installed = {"torch": "2.13.0+cpu", "numpy": "2.4.6", "pip": "25.0"}
    assert noop.differences(plan, installed, {"TRITON_INTERPRET": "1"}) == []
    assert noop.differences(plan, {**installed, "numpy": "2.4.5"}, {"TRITON_INTERPRET": "1"}) == [
        "numpy: 2.4.5 (lock: 2.4.6)"
    ]
    assert noop.differences(plan, installed, None) == ["environment fixes differ"]
    assert noop.differences(plan, {"numpy": "2.4.6"}, {"TRITON_INTERPRET": "1"}) == [
        "torch: missing (lock: 2.13.0+cpu)"
    ]


def test_uninstall_lists_greta_files_and_kernel_wheels(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    site.mkdir()
    for name in (envfix.PTH_NAME, envfix.JSON_NAME, hashrecord.RECORD_NAME, "other.pth"):
        (site / name).write_text("x")
    (site / "greta_kernels_gfx942-0.1.0.dist-info").mkdir()
    found = {p.name for p in uninstall.greta_files(site)}
    assert found == {envfix.PTH_NAME, envfix.JSON_NAME, hashrecord.RECORD_NAME}
    assert uninstall.kernel_distributions(site) == ["greta-kernels-gfx942"]


@pytest.mark.slow
def test_uninstall_stops_the_env_fixes_from_being_exported(tmp_path: Path) -> None:
    template = create_venv(tmp_path / "template")
    venv = copy_venv(template, tmp_path / "venv")
    python = python_of(venv)
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    )  # fmt: skip
    envfix.write_env_fixes(site, {"GRETA_FIX_PROBE": "on"}, {}, "cpu", None)
    probe = [python, "-c", "import os; print(os.environ.get('GRETA_FIX_PROBE'))"]
    assert subprocess.run(probe, capture_output=True, text=True).stdout.strip() == "on"
    proc = subprocess.run(
        [sys.executable, "-m", "greta", "uninstall", "--python", python, "--keep-greta"],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert f"removed {site / envfix.PTH_NAME}" in proc.stdout
    assert subprocess.run(probe, capture_output=True, text=True).stdout.strip() == "None"
