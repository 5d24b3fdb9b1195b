"""Install transactions that survive kills and neighbours (issue 11, findings 1-5).

Real `greta install` runs (pip and uv) against a local fake index, killed at named points
of the commit (a hooks file named by `GRETA_TEST_HOOKS` makes GRETA announce a point and wait there) or a
moment into the installer. Afterwards the environment must be byte-identical to before
or exactly the completed install, and after the next `greta` run no journal, backup or
staging folder may be left. The exhaustive sweeps are `slow`; one case of each kind runs
in CI.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import resource
import shlex
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from _install_helpers import (
    PY,
    REPO,
    Index,
    arm_checkpoint,
    copy_venv,
    make_wheel,
    pip_venv,
    python_of,
    wait_for,
)

from greta_install.environment.tools import find_uv
from greta_install.locks.lockfile import Lock, LockedPackage, format_lock

OLD_ALPHA = make_wheel("alpha-pkg", "1.0")
NEW = dict(
    [
        make_wheel("alpha-pkg", "2.0"),
        # Many files, so the installer is still writing when it is killed.
        make_wheel(
            "many-pkg", "1.0", extra={f"many_pkg/m{i:03d}.py": b"X = %d\n" % i for i in range(300)}
        ),
        make_wheel("beta-pkg", "1.0"),
        make_wheel("gamma-pkg", "1.0"),
        # A *file* named alpha_pkg: the installer fails on it after writing alpha 2.0.
        make_wheel("aaa-clash", "1.0", extra={"alpha_pkg": b"x"}),
    ]
)
VERSIONS = {"alpha-pkg": "2.0"}
INSTALLERS = [
    "pip",
    pytest.param("uv", marks=pytest.mark.skipif(find_uv() is None, reason="uv not installed")),
]


def _file(name: str) -> str:
    version = VERSIONS.get(name, "1.0")
    return f"{name.replace('-', '_')}-{version}-py3-none-any.whl"


def write_lock(tmp_path: Path, names: list[str], label: str) -> Path:
    packages = tuple(
        LockedPackage(
            name,
            VERSIONS.get(name, "1.0"),
            None,
            ("sha256:" + hashlib.sha256(NEW[_file(name)]).hexdigest(),),
        )
        for name in names
    )
    lock = Lock(
        target="cpu",
        python=PY,
        packages=packages,
        kernel_wheel=None,
        env={"GRETA_FIX_PROBE": label},
        meta={"target": "cpu", "python": PY},
    )
    path = tmp_path / f"{label}-lock.txt"
    path.write_text(format_lock(lock), encoding="utf-8")
    return path


def state(env_dir: Path) -> dict[str, str]:
    """Every file of the venv (lib/ and bin/) with its sha256, bytecode aside."""
    out = {}
    for top in ("lib", "bin"):
        for path in sorted((env_dir / top).rglob("*")):
            if "__pycache__" in path.parts:
                continue
            if path.is_symlink():
                out[str(path.relative_to(env_dir))] = "->" + os.readlink(path)
            elif path.name == "uv_cache.json":  # uv's timestamps: present, contents vary
                out[str(path.relative_to(env_dir))] = "uv-cache"
            elif path.name == "RECORD":  # the same, less uv_cache.json's line
                lines = [ln for ln in path.read_bytes().splitlines() if b"uv_cache.json" not in ln]
                out[str(path.relative_to(env_dir))] = hashlib.sha256(b"\n".join(lines)).hexdigest()
            elif path.is_file():
                out[str(path.relative_to(env_dir))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def env_of(index: Index, tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_", "GRETA_"))}
    env.update(
        PIP_CONFIG_FILE=os.devnull,
        PIP_INDEX_URL=index.url,
        PIP_NO_CACHE_DIR="1",
        PIP_RETRIES="0",
        PIP_TIMEOUT="20",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        UV_CACHE_DIR=str(tmp_path / "uv-cache"),
        UV_NO_CONFIG="1",
        PYTHONPATH=str(REPO),
        TMPDIR=str(tmp_path / "tmp"),
        **extra,
    )
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return env


def start(venv: Path, lock: Path, installer: str, env: dict[str, str]) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "greta", "install", "--lock", str(lock),
            "--python", python_of(venv), "--installer", installer, "--force-target"]  # fmt: skip
    return subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def next_greta_run(venv: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Any later greta run on the environment: `greta env` recovers a journal first."""
    return subprocess.run(
        [sys.executable, "-m", "greta", "env", "--python", python_of(venv)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def orphans(marker: Path) -> list[str]:
    """Live processes whose command line names `marker` (our staging folders)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            status = (proc / "status").read_text()
        except OSError:
            continue
        if str(marker) in cmdline and "State:\tZ" not in status:
            found.append(cmdline)
    return found


def leftovers(venv: Path, tmp_path: Path) -> list[str]:
    found = [str(p) for p in venv.rglob(".greta-txn*")]
    found += [str(p) for p in venv.rglob(".greta-rollback-*")]
    found += [str(p) for p in (tmp_path / "tmp").glob("greta-stage-*")]
    return found


@pytest.fixture(scope="module")
def base_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with alpha-pkg 1.0 installed (the install replaces it)."""
    root = tmp_path_factory.mktemp("reliability")
    path = pip_venv(tmp_path_factory, root / "venv")
    wheel = root / OLD_ALPHA[0]
    wheel.write_bytes(OLD_ALPHA[1])
    subprocess.run([python_of(path), "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    str(wheel)], check=True, timeout=120)  # fmt: skip
    return path


class Completed:
    """The state of a completed install per installer (the other acceptable outcome),
    computed on first use."""

    def __init__(self, base: Path, factory: pytest.TempPathFactory) -> None:
        self.base, self.factory, self.cache = base, factory, {}

    def __getitem__(self, installer: str) -> dict[str, str]:
        if installer not in self.cache:
            tmp = self.factory.mktemp(f"complete-{installer}")
            venv = copy_venv(self.base, tmp / "venv")
            with Index(NEW, {}) as index:
                lock = write_lock(tmp, ["alpha-pkg", "many-pkg"], "sweep")
                proc = start(venv, lock, installer, env_of(index, tmp))
                out, err = proc.communicate(timeout=240)
            assert proc.returncode == 0, out + err
            self.cache[installer] = state(venv)
        return self.cache[installer]


@pytest.fixture(scope="module")
def completed(base_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Completed:
    return Completed(base_venv, tmp_path_factory)


# (checkpoint, seconds to wait after it before the signal)
POINTS = [("installer", None), ("installer", 0.3), ("installer", 1.0), ("env-fixes", None),
          ("finish", None)]  # fmt: skip
SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGKILL]


def kill_at(
    base_venv: Path,
    completed: Completed,
    tmp_path: Path,
    installer: str,
    point: str,
    delay: float | None,
    sig: int,
) -> str:
    """One kill; returns "before" or "complete" (the state left); asserts it is one of them."""
    venv = copy_venv(base_venv, tmp_path / "venv")
    before = state(venv)
    lock = write_lock(tmp_path, ["alpha-pkg", "many-pkg"], "sweep")
    with Index(NEW, {}) as index:
        wait = 0 if delay is not None else 60
        env = env_of(index, tmp_path, **arm_checkpoint(tmp_path, point, wait))
        proc = start(venv, lock, installer, env)
        seen = wait_for(proc, f"greta-checkpoint: {point}")
        if delay:
            time.sleep(delay)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
        err = seen + err
        # No installer child runs on after GRETA is gone (it dies with its parent).
        time.sleep(0.3)
        assert orphans(tmp_path / "tmp") == []
        if sig != signal.SIGKILL:
            assert "Traceback" not in err, err
            if proc.returncode in (0, -sig):  # the signal came after the install had finished
                assert "installed 2 packages" in out, out + err
                assert state(venv) == completed[installer]
            else:
                assert proc.returncode == 128 + sig, out + err
                assert "the environment was put back as it was" in err, err
                assert state(venv) == before, err
        clean_env = env_of(index, tmp_path)
        after = next_greta_run(venv, clean_env)
    assert after.returncode == 0, after.stderr
    assert leftovers(venv, tmp_path) == []
    final = state(venv)
    if final == before:
        return "before"
    assert final == completed[installer], (point, delay, sig, after.stderr)
    return "complete"


@pytest.mark.parametrize("installer", ["pip"])
def test_sigkill_in_the_commit_is_undone_by_the_next_run(
    base_venv: Path, completed: Completed, tmp_path: Path, installer: str
) -> None:
    outcome = kill_at(base_venv, completed, tmp_path, installer, "env-fixes", None, signal.SIGKILL)
    assert outcome == "before"  # killed after the installer ran: the next run undid it


@pytest.mark.parametrize(
    ("sig", "point", "delay"),
    [
        pytest.param(signal.SIGINT, "installer", 0.3, id="SIGINT-installer"),
        pytest.param(
            signal.SIGHUP, "env-fixes", None, id="SIGHUP-env-fixes", marks=pytest.mark.slow
        ),
    ],
)
def test_a_signal_in_the_commit_puts_everything_back(
    base_venv: Path,
    completed: Completed,
    tmp_path: Path,
    sig: int,
    point: str,
    delay: float | None,
) -> None:
    assert kill_at(base_venv, completed, tmp_path, "pip", point, delay, sig) == "before"


@pytest.mark.slow
@pytest.mark.parametrize("installer", INSTALLERS)
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: signal.Signals(s).name)
@pytest.mark.parametrize(("point", "delay"), POINTS, ids=lambda v: str(v))
def test_kill_sweep(
    base_venv: Path,
    completed: Completed,
    tmp_path: Path,
    installer: str,
    sig: int,
    point: str,
    delay: float | None,
) -> None:
    outcome = kill_at(base_venv, completed, tmp_path, installer, point, delay, sig)
    print(f"KILL-SWEEP {installer} {signal.Signals(sig).name} {point}+{delay}: {outcome}")


def concurrent(
    base_venv: Path, tmp_path: Path, delay: float | None, installer: str
) -> tuple[str, str]:
    """A (beta + gamma) succeeds while B (alpha 2.0 + a clash) fails in its offline install.
    ``delay``: seconds between starting B and A; None: A starts while B holds the
    environment lock (B waits at its installer checkpoint until A says it is waiting)."""
    venv = copy_venv(base_venv, tmp_path / "venv")
    good = write_lock(tmp_path, ["beta-pkg", "gamma-pkg"], "good")
    bad = write_lock(tmp_path, ["alpha-pkg", "aaa-clash"], "bad")
    release = tmp_path / "release-b"
    with Index(NEW, {}) as index:
        env = env_of(index, tmp_path)
        a_seen = b_seen = ""
        if delay is None:
            b_env = env_of(index, tmp_path, **arm_checkpoint(tmp_path, "installer", 200, release))
            b = start(venv, bad, installer, b_env)
            b_seen = wait_for(b, "greta-checkpoint: installer")
            a = start(venv, good, installer, env)
            a_seen = wait_for(a, "waiting for it", stdout=True)
            release.touch()
        else:
            b = start(venv, bad, installer, env)
            time.sleep(delay)
            a = start(venv, good, installer, env)
        a_out, a_err = a.communicate(timeout=240)
        b_out, b_err = b.communicate(timeout=240)
        a_out, b_err = a_seen + a_out, b_seen + b_err
    assert a.returncode == 0, a_out + a_err
    assert b.returncode == 1, b_out + b_err
    assert "failed during the offline install step" in b_err, b_err
    assert "put back as it was" in b_err
    check = subprocess.run(
        [python_of(venv), "-c",
         "import alpha_pkg, beta_pkg, gamma_pkg; print(alpha_pkg.VERSION, beta_pkg.VERSION)"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert check.stdout.split() == ["1.0", "1.0"], check.stderr  # alpha 1.0 was there before both
    assert not list((venv / "lib").rglob("aaa_clash*"))
    assert leftovers(venv, tmp_path) == []
    return a_out + a_err, b_out + b_err


def test_two_installs_one_failing_keep_each_others_packages(
    base_venv: Path, tmp_path: Path
) -> None:
    a_err, _ = concurrent(base_venv, tmp_path, None, "pip")
    assert "waiting for it" in a_err  # the second install waited for the environment lock


@pytest.mark.slow
@pytest.mark.parametrize("installer", INSTALLERS)
@pytest.mark.parametrize("delay", [0.0, 0.2, 1.0, 3.0])
def test_concurrent_sweep(base_venv: Path, tmp_path: Path, delay: float, installer: str) -> None:
    concurrent(base_venv, tmp_path, delay, installer)


@pytest.mark.slow
@pytest.mark.parametrize("installer", INSTALLERS)
def test_disk_full_midway_removes_the_half_written_wheel(
    base_venv: Path, tmp_path: Path, installer: str
) -> None:
    """RLIMIT_FSIZE stands in for a full disk: writing a big member fails with EFBIG (pip)
    or SIGXFSZ (uv) after the other files of the wheel were written."""
    big = make_wheel(
        "big-pkg",
        "1.0",
        extra={f"big_pkg/f{i:03d}.py": b"Y = 1\n" for i in range(200)}
        | {"big_pkg/zz_huge.bin": b"\0" * (2 << 20)},
    )

    # Store compressed, so the download stays under the limit and only the install breaks.
    raw = zipfile.ZipFile(io.BytesIO(big[1]))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for info in raw.infolist():
            zf.writestr(info.filename, raw.read(info.filename))
    files = {**NEW, big[0]: buf.getvalue()}
    venv = copy_venv(base_venv, tmp_path / "venv")
    before = state(venv)
    lock = Lock(target="cpu", python=PY, packages=(LockedPackage("big-pkg", "1.0", None,
                ("sha256:" + hashlib.sha256(files[big[0]]).hexdigest(),)),), kernel_wheel=None,
                env={}, meta={"target": "cpu", "python": PY})  # fmt: skip
    path = tmp_path / "big-lock.txt"
    path.write_text(format_lock(lock), encoding="utf-8")
    with Index(files, {}) as index:
        argv = [sys.executable, "-m", "greta", "install", "--lock", str(path),
                "--python", python_of(venv), "--installer", installer, "--force-target"]  # fmt: skip
        proc = subprocess.run(
            argv, cwd=REPO, env=env_of(index, tmp_path), capture_output=True, text=True,
            timeout=240, check=False,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20)),
        )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "put back as it was" in proc.stderr, proc.stderr
    assert state(venv) == before
    assert not list((venv / "lib").rglob("big_pkg"))
    assert leftovers(venv, tmp_path) == []


def test_dry_run_shows_exactly_the_commands_it_runs(base_venv: Path, tmp_path: Path) -> None:
    """Every Python child of the real install logs its own argv (a .pth in the target venv);
    the list must equal what `--dry-run` showed, <stage> filled in."""
    venv = copy_venv(base_venv, tmp_path / "venv")
    site = next((venv / "lib").glob("python3.*/site-packages"))
    log = tmp_path / "argv.log"
    # A .pth, not a sitecustomize.py: Debian/Ubuntu Pythons ship their own sitecustomize in the
    # stdlib, which comes first on sys.path and shadows one in site-packages. The `import`
    # line of a .pth runs at every start, `python -I` included (-I drops only the user site).
    # It imports a module, so a .pth read twice (lib64 -> lib) still logs once.
    (site / "greta_test_argv_log.py").write_text(
        "import os, sys, shlex\n"
        "p = os.environ.get('GRETA_TEST_ARGV_LOG')\n"
        "if p:\n"
        "    open(p, 'a').write(shlex.join(sys.orig_argv) + '\\n')\n"
    )
    (site / "greta-test-argv-log.pth").write_text("import greta_test_argv_log\n")
    lock = write_lock(tmp_path, ["alpha-pkg", "many-pkg"], "shown")
    argv = ["install", "--lock", str(lock), "--python", python_of(venv), "--installer", "pip",
            "--force-target"]  # fmt: skip
    with Index(NEW, {}) as index:
        env = env_of(index, tmp_path, GRETA_TEST_ARGV_LOG=str(log))
        shown = subprocess.run(
            [sys.executable, "-m", "greta", *argv, "--dry-run", "--json"],
            cwd=REPO, env={**env, "GRETA_TEST_ARGV_LOG": ""}, capture_output=True, text=True,
            timeout=120, check=True,
        )  # fmt: skip
        real = subprocess.run(
            [sys.executable, "-m", "greta", *argv],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=240, check=False,
        )  # fmt: skip
    assert real.returncode == 0, real.stdout + real.stderr
    steps = {s["step"]: s["commands"] for s in json.loads(shown.stdout)["steps"]}
    expected = steps["stage"] + steps["commit"]
    ran = [
        line for line in log.read_text().splitlines() if " download " in line or " install " in line
    ]
    ran_argv = [shlex.split(line) for line in ran]
    stage = ran_argv[0][ran_argv[0].index("--dest") + 1].split("/.work/", 1)[0]
    shown_argv = [[a.replace("<stage>", stage) for a in shlex.split(c)] for c in expected]
    assert shown_argv == ran_argv
    assert len(ran) == 3  # two downloads, one install


def test_env_fixes_that_cannot_be_written_undo_the_install(base_venv: Path, tmp_path: Path) -> None:
    venv = copy_venv(base_venv, tmp_path / "venv")
    site = next((venv / "lib").glob("python3.*/site-packages"))
    (site / "greta-env.json").mkdir()  # the fixes cannot be written there
    before = state(venv)
    lock = write_lock(tmp_path, ["alpha-pkg", "many-pkg"], "fixes")
    with Index(NEW, {}) as index:
        proc = start(venv, lock, "pip", env_of(index, tmp_path))
        out, err = proc.communicate(timeout=240)
    assert proc.returncode == 1, out + err
    assert "failed: env-fixes: cannot write the environment fixes" in err, err
    assert "The environment was put back as it was" in err and "Traceback" not in err
    assert state(venv) == before
    assert leftovers(venv, tmp_path) == []


def test_a_kernel_wheel_that_would_run_code_is_refused(base_venv: Path, tmp_path: Path) -> None:
    """Pinned in the lock and matching its hash, but carrying a .pth: refused at staging."""
    from _install_helpers import make_kernel_wheel

    marker = tmp_path / "pwned"
    filename, data = make_kernel_wheel(
        "sm_90",
        extra={"greta_kernels_sm_90-zz.pth": f"import os; open({str(marker)!r}, 'w')\n".encode()},
    )
    wheels = tmp_path / "kernels"
    wheels.mkdir()
    (wheels / filename).write_bytes(data)
    alpha = NEW[_file("alpha-pkg")]
    lock = Lock(
        target="cuda", python=PY,
        packages=(LockedPackage("alpha-pkg", "2.0", None, ("sha256:" + hashlib.sha256(alpha).hexdigest(),)),),
        kernel_wheel="greta-kernels-sm-90==0.1.0",
        kernel_hashes={"greta-kernels-sm-90==0.1.0": "sha256:" + hashlib.sha256(data).hexdigest()},
        env={}, meta={"target": "cuda", "python": PY},
    )  # fmt: skip
    path = tmp_path / "cuda-lock.txt"
    path.write_text(format_lock(lock), encoding="utf-8")
    venv = copy_venv(base_venv, tmp_path / "venv")
    before = state(venv)
    with Index(NEW, {}) as index:
        proc = subprocess.run(
            [sys.executable, "-m", "greta", "install", "--lock", str(path), "--python",
             python_of(venv), "--installer", "pip", "--arch", "sm_90", "--force-target",
             "--kernel-wheels", str(wheels)],
            cwd=REPO, env=env_of(index, tmp_path), capture_output=True, text=True, timeout=240,
        )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "greta-kernels-sm-90: refused" in proc.stderr and ".pth" in proc.stderr, proc.stderr
    assert "the environment is unchanged" in proc.stderr
    assert state(venv) == before and not marker.exists()
