"""`greta install` is all or nothing, against a local package index that misbehaves.

A PEP 503 simple index runs on 127.0.0.1 in a thread (bounded in requests and time, it
stops itself) and serves tiny wheels built here. One file's download breaks mid-way,
answers 500, or does not match its locked hash; a version is missing; Ctrl-C arrives
while staging. Each time the real installer runs against a fresh venv, and the venv's
site-packages must be byte-identical afterwards, with an error naming the package and
the reason. A success case really installs and verifies, with pip and with uv.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _install_helpers import (
    PY,
    REPO,
    Index,
    copy_venv,
    create_venv,
    make_kernel_wheel,
    make_wheel,
    python_of,
    snapshot,
    wait_for,
)

from greta_install.environment.tools import find_uv
from greta_install.install import installer as inst
from greta_install.locks.lockfile import Lock, LockedPackage, format_lock

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def template_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_venv(tmp_path_factory.mktemp("template") / "venv")


@pytest.fixture
def fresh_venv(template_venv: Path, tmp_path: Path) -> Path:
    return copy_venv(template_venv, tmp_path / "venv")


WHEELS = {
    name: make_wheel(name, "1.0", kib)
    for name, kib in (("alpha-pkg", 1), ("beta-pkg", 256), ("gamma-pkg", 1))
}


def write_lock(tmp_path: Path, missing_version: bool = False) -> Path:
    packages = []
    for name, (_filename, data) in WHEELS.items():
        version = "9.9" if (missing_version and name == "gamma-pkg") else "1.0"
        packages.append(
            LockedPackage(name, version, None, ("sha256:" + hashlib.sha256(data).hexdigest(),))
        )
    lock = Lock(
        target="cpu",
        python=PY,
        packages=tuple(packages),
        kernel_wheel=None,
        env={"GRETA_FIX_PROBE": "from-greta"},
        meta={"target": "cpu", "python": PY, "platform": "x86_64-manylinux_2_28"},
    )
    path = tmp_path / "test-lock.txt"
    path.write_text(format_lock(lock), encoding="utf-8")
    return path


def pip_env(index: Index, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env.update(
        PIP_CONFIG_FILE=os.devnull,  # none of this machine's pip configuration
        PIP_INDEX_URL=index.url,
        PIP_NO_CACHE_DIR="1",
        PIP_RETRIES="0",
        PIP_TIMEOUT="20",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        UV_CACHE_DIR=str(tmp_path / "uv-cache"),
        UV_NO_CONFIG="1",
        PYTHONPATH=str(REPO),
        GRETA_KERNEL_INDEX="",
        TMPDIR=str(tmp_path / "tmp"),
        GRETA_HASH_RECORD=str(tmp_path / "user-hashes.json"),
        GRETA_KERNEL_CACHE=str(tmp_path / "kernel-cache"),
    )
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return env


def assert_no_stage_left(tmp_path: Path) -> None:
    assert list((tmp_path / "tmp").glob("greta-stage-*")) == []


def greta_install(env_dir: Path, lock: Path, installer: str, env: dict[str, str], **popen: object):
    argv = [
        sys.executable,
        "-m",
        "greta",
        "install",
        "--lock",
        str(lock),
        "--python",
        python_of(env_dir),
        "--force-target",  # a cpu lock also on a GPU test machine
        "--installer",
        installer,
        "--no-smoke",  # these tiny wheels are not torch: the smoke test has its own tests
    ]
    return subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen
    )


INSTALLERS = [
    "pip",
    pytest.param("uv", marks=pytest.mark.skipif(find_uv() is None, reason="uv not installed")),
]


@pytest.mark.parametrize("installer", INSTALLERS)
@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        # pip accepts a body cut short of its Content-Length; the hash check catches it.
        ("drop", "hash mismatch (the download was altered or cut short)"),
        ("500", "network error"),
        ("tamper", "hash mismatch"),
    ],
)
def test_failure_midway_leaves_the_environment_untouched(
    fresh_venv: Path, tmp_path: Path, installer: str, fault: str, reason: str
) -> None:
    files = dict(WHEELS.values())
    broken = WHEELS["beta-pkg"][0]
    with Index(files, {broken: fault}) as index:
        before = snapshot(fresh_venv)
        proc = greta_install(fresh_venv, write_lock(tmp_path), installer, pip_env(index, tmp_path))
        out, err = proc.communicate(timeout=240)
    assert proc.returncode == 1, out + err
    assert "beta-pkg: " + reason in err, err
    assert "environment is unchanged" in err
    assert "Traceback" not in err
    assert snapshot(fresh_venv) == before
    assert_no_stage_left(tmp_path)
    assert "[2/3] staging beta-pkg==1.0" in out  # it failed mid-way, after alpha was staged


def test_missing_version_on_the_index(fresh_venv: Path, tmp_path: Path) -> None:
    with Index(dict(WHEELS.values()), {}) as index:
        before = snapshot(fresh_venv)
        proc = greta_install(
            fresh_venv, write_lock(tmp_path, missing_version=True), "pip", pip_env(index, tmp_path)
        )
        out, err = proc.communicate(timeout=240)
    assert proc.returncode == 1, out + err
    assert "gamma-pkg: version not found on the index" in err, err
    assert snapshot(fresh_venv) == before


def test_ctrl_c_while_staging(fresh_venv: Path, tmp_path: Path) -> None:
    with Index(dict(WHEELS.values()), {WHEELS["beta-pkg"][0]: "slow"}) as index:
        before = snapshot(fresh_venv)
        proc = greta_install(fresh_venv, write_lock(tmp_path), "pip", pip_env(index, tmp_path))
        seen = wait_for(proc, "staging beta-pkg", stdout=True)
        time.sleep(1.0)  # the slow download is under way
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, seen + out + err
    assert "interrupted while staging" in err
    assert snapshot(fresh_venv) == before
    assert_no_stage_left(tmp_path)


@pytest.mark.parametrize("installer", INSTALLERS)
def test_success_installs_verifies_and_persists_env(
    fresh_venv: Path, tmp_path: Path, installer: str
) -> None:
    with Index(dict(WHEELS.values()), {}) as index:
        env = pip_env(index, tmp_path)
        proc = greta_install(fresh_venv, write_lock(tmp_path), installer, env)
        out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, out + err
    assert f"offline with {installer}" in out
    # The staged files sit in a fresh folder each run, so no cache entry of theirs is ever
    # read again: the install leaves the user's uv cache as it was (each run used to add
    # an unpacked copy of every wheel: gigabytes for torch).
    assert not list((tmp_path / "uv-cache").glob("archive-*/*"))
    python = python_of(fresh_venv)
    clean = {k: v for k, v in env.items() if k != "GRETA_FIX_PROBE"}
    check = subprocess.run(
        [
            python,
            "-c",
            "import os, alpha_pkg, beta_pkg, gamma_pkg; print(alpha_pkg.VERSION, os.environ['GRETA_FIX_PROBE'])",
        ],
        capture_output=True,
        text=True,
        env=clean,
        timeout=60,
        check=False,
    )
    assert check.stdout.split() == ["1.0", "from-greta"], check.stderr
    # A value the user sets wins over the persisted fix.
    mine = subprocess.run(
        [python, "-c", "import os; print(os.environ['GRETA_FIX_PROBE'])"],
        capture_output=True,
        text=True,
        env={**clean, "GRETA_FIX_PROBE": "mine"},
        timeout=60,
        check=False,
    )
    assert mine.stdout.strip() == "mine"
    shown = subprocess.run(
        [sys.executable, "-m", "greta", "env", "--python", python],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=clean,
        timeout=60,
        check=False,
    )
    assert "export GRETA_FIX_PROBE=from-greta" in shown.stdout
    cleared = subprocess.run(
        [sys.executable, "-m", "greta", "env", "--clear", "--python", python],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=clean,
        timeout=60,
        check=False,
    )
    assert cleared.returncode == 0
    after = subprocess.run(
        [python, "-c", "import os; print(os.environ.get('GRETA_FIX_PROBE'))"],
        capture_output=True,
        text=True,
        env=clean,
        timeout=60,
        check=False,
    )
    assert after.stdout.strip() == "None"


def test_unverified_pin_is_trusted_on_first_use_and_held_to_it(
    fresh_venv: Path, tmp_path: Path
) -> None:
    """A pin without a lock hash: --strict refuses it; the default installs it, shows and
    records its sha256; a later install that gets a different file is refused."""
    name = "alpha-pkg"
    lock = Lock(
        target="cpu",
        python=PY,
        packages=(LockedPackage(name, "1.0", None, ()),),
        kernel_wheel=None,
        env={},
        meta={"target": "cpu", "python": PY},
    )
    path = tmp_path / "unverified.txt"
    path.write_text(format_lock(lock), encoding="utf-8")

    def install(env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "greta", "install", "--lock", str(path),
                "--python", python_of(fresh_venv), "--force-target", "--installer", "pip",
                "--no-smoke", *extra]  # fmt: skip
        return subprocess.run(
            argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=240, check=False
        )

    filename, data = WHEELS[name]
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    with Index(dict(WHEELS.values()), {}) as index:
        env = pip_env(index, tmp_path)
        before = snapshot(fresh_venv)
        strict = install(env, "--strict")
        assert strict.returncode == 1 and "no hash in the lock and none recorded" in strict.stderr
        assert snapshot(fresh_venv) == before
        first = install(env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert f"FIRST USE alpha-pkg==1.0: {filename} has {digest}" in first.stdout
    record = (Path(tmp_path) / "user-hashes.json").read_text()
    assert filename in record and digest in record
    # Same file name, other bytes (a re-published or tampered wheel): refused, untouched.
    installed = snapshot(fresh_venv)
    _, other = make_wheel(name, "1.0", payload_kib=2)
    with Index({filename: other}, {}) as index:
        changed = install(pip_env(index, tmp_path), "--reinstall")
    assert changed.returncode == 1, changed.stdout + changed.stderr
    assert "the file changed since it was first trusted" in changed.stderr, changed.stderr
    assert digest in changed.stderr
    assert snapshot(fresh_venv) == installed


def write_kernel_lock(tmp_path: Path) -> Path:
    """A cuda lock with one package from the test index and the sm_90 kernel wheel."""
    lock = Lock(
        target="cuda",
        python=PY,
        packages=(
            LockedPackage(
                "alpha-pkg",
                "1.0",
                None,
                ("sha256:" + hashlib.sha256(WHEELS["alpha-pkg"][1]).hexdigest(),),
            ),
        ),
        kernel_wheel="greta-kernels-sm-90==0.1.0",
        env={},
        meta={"target": "cuda", "python": PY},
    )
    path = tmp_path / "cuda-lock.txt"
    path.write_text(format_lock(lock), encoding="utf-8")
    return path


def test_kernel_wheel_from_a_directory_is_checked_against_sha256sums(
    fresh_venv: Path, tmp_path: Path
) -> None:
    filename, data = make_kernel_wheel("sm_90")
    wheels = tmp_path / "kernel-wheels"
    wheels.mkdir()
    (wheels / filename).write_bytes(data)
    path = write_kernel_lock(tmp_path)
    argv = [
        sys.executable,
        "-m",
        "greta",
        "install",
        "--lock",
        str(path),
        "--python",
        python_of(fresh_venv),
        "--installer",
        "pip",
        "--arch",
        "sm_90",
        "--kernel-wheels",
        str(wheels),
        "--allow-unverified",  # the lock pins no hash: SHA256SUMS is all there is
        "--force-target",  # a cuda lock on this CPU machine
        "--no-smoke",
    ]
    with Index(dict(WHEELS.values()), {}) as index:
        env = pip_env(index, tmp_path)
        (wheels / "SHA256SUMS").write_text(f"{'0' * 64}  {filename}\n")
        before = snapshot(fresh_venv)
        bad = subprocess.run(
            argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=240, check=False
        )
        assert bad.returncode == 1 and "greta-kernels-sm-90: hash mismatch" in bad.stderr, (
            bad.stderr
        )
        assert snapshot(fresh_venv) == before
        (wheels / "SHA256SUMS").write_text(f"{hashlib.sha256(data).hexdigest()}  {filename}\n")
        good = subprocess.run(
            argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=240, check=False
        )
    assert good.returncode == 0, good.stdout + good.stderr
    assert "FIRST USE kernel wheel" in good.stdout + good.stderr
    check = subprocess.run(
        [python_of(fresh_venv), "-c", "import greta_kernels_sm_90, alpha_pkg"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert check.returncode == 0, check.stderr
    # Issue 30 item 5: the unpinned wheel's hash was recorded like a package's; another
    # file of the same name (its SHA256SUMS line changed with it) is refused.
    _, other = make_kernel_wheel("sm_90", extra={"greta_kernels_sm_90/extra.py": b"x = 1\n"})
    (wheels / filename).write_bytes(other)
    (wheels / "SHA256SUMS").write_text(f"{hashlib.sha256(other).hexdigest()}  {filename}\n")
    with Index(dict(WHEELS.values()), {}) as index:
        env = pip_env(index, tmp_path)
        before = snapshot(fresh_venv)
        again = subprocess.run(
            [*argv, "--reinstall"], cwd=REPO, env=env, capture_output=True, text=True,
            timeout=240, check=False,
        )  # fmt: skip
    assert again.returncode == 1 and "the file changed since it was first trusted" in again.stderr
    assert snapshot(fresh_venv) == before


def test_kernel_wheel_lookup_on_an_index() -> None:
    filename, data = make_kernel_wheel("gfx942")
    with Index({filename: data}, {}) as index:
        refused = inst.find_kernel_wheel(index.url, "greta-kernels-gfx942==0.1.0")
        assert refused.location is None and "plain http is refused" in (refused.problem or "")
        found = inst.find_kernel_wheel(index.url, "greta-kernels-gfx942==0.1.0", allow_http=True)
        assert found.location == f"{index.url.rsplit('/simple/', 1)[0]}/files/{filename}"
        assert found.sha256 == hashlib.sha256(data).hexdigest() and not found.problem
        other = inst.find_kernel_wheel(index.url, "greta-kernels-gfx942==0.2.0", allow_http=True)
        assert other.location is None and "is not on" in (other.problem or "")
        absent = inst.find_kernel_wheel(index.url, "greta-kernels-gfx1100==0.1.0", allow_http=True)
        assert absent.location is None and "greta-kernels-gfx1100" in (absent.problem or "")
        url = index.url
    gone = inst.find_kernel_wheel(url, "greta-kernels-gfx942==0.1.0", allow_http=True)  # stopped
    assert gone.location is None and "unreachable" in (gone.problem or "")


def test_kernel_wheel_from_an_index_is_hash_checked_and_all_or_nothing(
    fresh_venv: Path, tmp_path: Path
) -> None:
    filename, data = make_kernel_wheel("sm_90")
    path = write_kernel_lock(tmp_path)

    def argv(kernel_index: str) -> list[str]:
        return [sys.executable, "-m", "greta", "install", "--lock", str(path),
                "--python", python_of(fresh_venv), "--installer", "pip", "--arch", "sm_90",
                "--kernel-wheels", kernel_index, "--allow-unverified", "--force-target",
                "--allow-http", "--no-smoke"]  # fmt: skip

    files = dict(WHEELS.values())
    with Index(files, {}) as index, Index({filename: data}, {filename: "drop"}) as kernels:
        env = pip_env(index, tmp_path)
        before = snapshot(fresh_venv)
        bad = subprocess.run(
            argv(kernels.url), cwd=REPO, env=env, capture_output=True, text=True, timeout=240
        )
        # The connection drops a third of the way: the index's sha256 catches it.
        assert bad.returncode == 1 and "greta-kernels-sm-90" in bad.stderr, bad.stderr
        assert "hash mismatch" in bad.stderr or "network error" in bad.stderr, bad.stderr
        assert snapshot(fresh_venv) == before
        assert_no_stage_left(tmp_path)
    with Index(files, {}) as index, Index({filename: data}, {}) as kernels:
        env = pip_env(index, tmp_path)
        good = subprocess.run(
            argv(kernels.url), cwd=REPO, env=env, capture_output=True, text=True, timeout=240
        )
    assert good.returncode == 0, good.stdout + good.stderr
    served_at = f"{kernels.url.rsplit('/simple/', 1)[0]}/files/{filename}"
    assert f"staging kernel wheel greta-kernels-sm-90==0.1.0 from {served_at}" in good.stdout
    # greta is not in that environment: the launcher build is skipped with a warning.
    assert "warning: warm: greta warm failed" in good.stdout, good.stdout
    check = subprocess.run(
        [python_of(fresh_venv), "-c", "import greta_kernels_sm_90, alpha_pkg"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stderr


def test_failure_inside_the_offline_install_puts_the_environment_back(
    fresh_venv: Path, tmp_path: Path
) -> None:
    # alpha-pkg 1.0 is installed; the lock wants alpha-pkg 2.0 and aaa-clash, whose wheel
    # holds a *file* named alpha_pkg: pip installs alpha 2.0 over 1.0, then fails on the
    # clash with the alpha_pkg/ directory, which by itself leaves alpha 2.0 behind.
    old_name, old_data = WHEELS["alpha-pkg"]
    (tmp_path / old_name).write_bytes(old_data)
    subprocess.run(
        [python_of(fresh_venv), "-m", "pip", "install", "-q", "--no-index", "--no-deps",
         str(tmp_path / old_name)],
        check=True, timeout=120,
    )  # fmt: skip
    new = dict(
        [make_wheel("alpha-pkg", "2.0"), make_wheel("aaa-clash", "1.0", extra={"alpha_pkg": b"x"})]
    )
    lock = Lock(
        target="cpu",
        python=PY,
        packages=tuple(
            LockedPackage(
                name,
                "2.0" if name == "alpha-pkg" else "1.0",
                None,
                ("sha256:" + hashlib.sha256(new[f]).hexdigest(),),
            )
            for name, f in (
                ("alpha-pkg", "alpha_pkg-2.0-py3-none-any.whl"),
                ("aaa-clash", "aaa_clash-1.0-py3-none-any.whl"),
            )
        ),
        kernel_wheel=None,
        env={},
        meta={"target": "cpu", "python": PY},
    )
    path = tmp_path / "clash-lock.txt"
    path.write_text(format_lock(lock), encoding="utf-8")
    before = snapshot(fresh_venv)
    with Index(new, {}) as index:
        proc = greta_install(fresh_venv, path, "pip", pip_env(index, tmp_path))
        out, err = proc.communicate(timeout=240)
    assert proc.returncode == 1, out + err
    assert "failed during the offline install step" in err, err
    # The rollback really had work to do: alpha 2.0 had been installed over 1.0.
    assert "files it had added" in err and "put back" in err, err
    assert snapshot(fresh_venv) == before
    check = subprocess.run(
        [python_of(fresh_venv), "-c", "import alpha_pkg; print(alpha_pkg.VERSION)"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert check.stdout.strip() == "1.0", check.stderr
    assert not list(fresh_venv.rglob(".greta-rollback-*"))
    assert_no_stage_left(tmp_path)
