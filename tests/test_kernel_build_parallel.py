"""One arch's kernel build on all cores: spawned workers, results in spec order.

The wheel built with two workers holds exactly the bytes of the one built with one
(the session's shared gfx942 wheel, built with jobs=1); a failed or crashed worker names
the kernel and no wheel is written; Ctrl-C and timeouts stop every worker process.
"""

from __future__ import annotations

import json
import os
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
from conftest import build_shared_wheel

from greta_core.kernel_wheels import buildpool
from greta_install import commandline
from greta_install.install import kernel_build as kb


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper that never comes, in a container, is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _entries(wheel: str) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def test_two_workers_build_the_same_wheel_as_one(
    gfx942_wheel: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[int, int, str]] = []
    outcome = build_shared_wheel(
        tmp_path, jobs=2, progress=lambda done, total, res: seen.append((done, total, res.spec))
    )
    # Progress: one call per kernel as it finished, counting up to the total.
    total = outcome["compiled"]
    assert [(d, t) for d, t, _ in seen] == [(k, total) for k in range(1, total + 1)]
    # Results in spec order, whichever worker finished first.
    assert [r["spec"] for r in outcome["results"]] == [r["spec"] for r in gfx942_wheel["results"]]
    one, two = _entries(gfx942_wheel["wheel"]), _entries(outcome["wheel"])
    assert sorted(one) == sorted(two)
    record = next(name for name in one if name.endswith("/RECORD"))
    manifest = next(name for name in one if name.endswith("/manifest.json"))
    # Only the build date (and the RECORD line hashing the manifest) may differ.
    differ = {name for name in one if one[name] != two[name]}
    assert differ <= {record, manifest}
    m1, m2 = json.loads(one[manifest]), json.loads(two[manifest])
    assert m1.pop("build_date") and m2.pop("build_date")
    assert m1 == m2 and len(m1["kernels"]) == total > 0


def test_source_date_epoch_fixes_the_build_date(monkeypatch: pytest.MonkeyPatch) -> None:
    from greta_core.kernel_wheels.aot import environment

    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    assert environment()["date"] == "2023-11-14T22:13:20Z"


def test_jobs_come_from_the_option_then_the_environment_then_the_cores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from greta_core.errors import AotError

    monkeypatch.setenv(buildpool.JOBS_ENV, "3")
    assert buildpool.resolve_jobs(5) == 5
    assert buildpool.resolve_jobs(0) == 3
    monkeypatch.delenv(buildpool.JOBS_ENV)
    assert buildpool.resolve_jobs(0) == len(os.sched_getaffinity(0))
    monkeypatch.setenv(buildpool.JOBS_ENV, "many")
    with pytest.raises(AotError, match="GRETA_BUILD_JOBS"):
        buildpool.resolve_jobs(0)


# Worker functions for the pool: module-level so spawned workers import them by name.
def crash_on_second(task: buildpool.Task) -> Any:
    if task.index == 1:
        os._exit(3)
    return buildpool.failed_result(task, "")  # a stand-in result; never looked at as ok


def raise_on_second(task: buildpool.Task) -> Any:
    if task.index == 1:
        raise RuntimeError("compiler exploded")
    return buildpool.failed_result(task, "")


def sleep_long(path: str) -> None:
    Path(path).write_text(str(os.getpid()))
    time.sleep(120)


def _tasks(n: int) -> list[buildpool.Task]:
    return [buildpool.Task("gfx942", "vec_add", i, f"k{i}", "aligned", "") for i in range(n)]


def test_a_crashed_worker_is_named_and_the_rest_is_not_compiled() -> None:
    tasks = _tasks(4)
    with buildpool.worker_pool(1) as pool:
        results = buildpool.compile_all(pool, tasks, 1, work=crash_on_second)
    errors = [r.error for r in results]
    assert errors[0] == ""
    assert errors[1] == "a build worker process died while compiling gfx942 k1 [aligned]"
    assert errors[2:] == ["not compiled: " + errors[1]] * 2


def test_a_raising_worker_fails_only_its_kernel() -> None:
    with buildpool.worker_pool(2) as pool:
        results = buildpool.compile_all(pool, _tasks(3), 2, work=raise_on_second)
    assert [r.error for r in results] == ["", "RuntimeError: compiler exploded", ""]


def test_a_failed_kernel_leaves_no_wheel(tmp_path: Path) -> None:
    from greta_core.commands.build_kernels import package_arch

    [task] = _tasks(1)
    failed = buildpool.failed_result(task, "RuntimeError: compiler exploded")
    outcome = package_arch("gfx942", tmp_path, tmp_path / "out", [failed], [], [], "{}", 1.0)
    assert outcome["fatal"] == (
        "1 kernel(s) failed, no wheel written: k0 [aligned]: RuntimeError: compiler exploded"
    )
    assert not (tmp_path / "out").exists()


def test_ctrl_c_stops_the_workers(tmp_path: Path) -> None:
    marker = tmp_path / "pid"
    with pytest.raises(KeyboardInterrupt), buildpool.worker_pool(1) as pool:
        pool.submit(sleep_long, str(marker))
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        raise KeyboardInterrupt
    assert not _alive(int(marker.read_text()))


FAKE_BUILD = """#!{python}
import os, subprocess, sys, time
print("building kernel wheels for gfx942 with 2 worker process(es)", flush=True)
for k in range(1, 4):
    print("[" + "#" * k + "." * (3 - k) + f"] {{k}}/3 gfx942 vec_add[fp32] [aligned] ok 0.10s",
          flush=True)
if "{mode}" == "fail":
    print("[###] 3/3 gfx942 col_sum[fp16] [ragged] ERROR 0.10s", flush=True)
    print("gfx942: FAILED: 1 kernel(s) failed, no wheel written: col_sum[fp16] [ragged]", flush=True)
    sys.exit(1)
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
open("{pidfile}", "w").write(str(worker.pid))
time.sleep(120)
"""


def _fake_python(tmp_path: Path, mode: str) -> tuple[str, Path]:
    pidfile = tmp_path / "worker.pid"
    script = tmp_path / f"fake-python-{mode}"
    script.write_text(FAKE_BUILD.format(python=sys.executable, mode=mode, pidfile=pidfile))
    script.chmod(0o755)
    return str(script), pidfile


def test_install_relays_progress_and_a_failed_build_caches_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GRETA_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GRETA_HASH_RECORD", str(tmp_path / "hashes.json"))
    monkeypatch.setattr(kb, "triton_fingerprint", lambda python: "f" * 32)
    python, _ = _fake_python(tmp_path, "fail")
    logged: list[str] = []
    with pytest.raises(kb.KernelBuildError) as info:
        kb.build_or_reuse(python, "gfx942", log=logged.append)
    assert "col_sum[fp16] [ragged]" in str(info.value) and "exit 1" in str(info.value)
    assert "  building kernel wheels for gfx942 with 2 worker process(es)" in logged
    # The first progress line at once, the failed kernel's line, the last line.
    assert "  [#..] 1/3 gfx942 vec_add[fp32] [aligned] ok 0.10s" in logged
    assert any(" ERROR " in line for line in logged)
    assert not list((tmp_path / "cache").glob("**/*.whl"))


def test_a_build_past_its_time_is_killed_with_its_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    python, pidfile = _fake_python(tmp_path, "hang")
    argv = kb.build_argv(python, "gfx942", str(tmp_path / "out"))
    with pytest.raises(kb.KernelBuildError, match="ran past 2s"):
        kb._run_with_progress(argv, dict(os.environ), "gfx942", lambda line: None, 2.0)
    worker = int(pidfile.read_text())
    deadline = time.monotonic() + 5  # SIGKILL is delivered asynchronously
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(worker)


def test_the_build_command_leaves_the_job_count_to_the_build_unless_given() -> None:
    assert "--jobs" not in kb.build_argv("python", "sm_90", "out")
    assert kb.build_argv("python", "sm_90", "out", 4)[-2:] == ["--jobs", "4"]
    assert commandline.parse_progress(commandline.progress_line(7, 756, "gfx942 x ok")) == (7, 756)
    assert commandline.parse_progress("gfx942: FAILED: no kernel compiled") is None
