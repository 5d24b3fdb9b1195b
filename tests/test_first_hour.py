"""What a new user met in their first hour (issue 28), each with a test."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import types
import venv
from pathlib import Path

import tomllib
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
            [python, "-m", "greta", "install", "--target", "cpu", "--force-target", *argv],
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


def _greta(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "greta", *argv],
        capture_output=True, text=True, cwd=REPO, timeout=300, check=False,
    )  # fmt: skip


def test_row_previous_on_a_target_without_one_says_so() -> None:
    proc = _greta("install", "--target", "cpu", "--row", "previous", "--dry-run")
    assert proc.returncode == 2
    assert "target cpu has no 'previous' row on Python" in proc.stderr
    assert "(it has: current)" in proc.stderr


def _plan(*argv: str) -> tuple[int, dict]:
    proc = _greta("install", "--dry-run", "--json", *argv)
    return proc.returncode, json.loads(proc.stdout)


def test_target_is_case_insensitive_and_arch_implies_its_target() -> None:
    code, plan = _plan("--target", "MI300X", "--force-target")
    assert (code, plan["target"], plan["ready"]) == (0, "mi300x", True)
    code, plan = _plan("--arch", "gfx1100", "--force-target")
    assert (code, plan["target"], plan["arch"]) == (0, "radeon", "gfx1100")
    code, plan = _plan("--arch", "sm_90", "--force-target")
    assert plan["target"] == "cuda"


def test_a_foreign_target_dry_run_is_not_ready_and_names_the_flag() -> None:
    from greta_install.detection.detect import detect
    from greta_install.detection.system_view import open_view

    here = detect(open_view(None)).target
    foreign = "radeon" if here == "mi300x" else "mi300x"
    code, plan = _plan("--target", foreign)
    assert code == 1 and plan["ready"] is False
    assert any("--force-target" in b and f"not {foreign}" in b for b in plan["blockers"])


def test_save_wheelhouse_on_a_matching_environment_does_not_reinstall(
    tmp_path: Path, monkeypatch
) -> None:
    from greta_install.commands import install
    from greta_install.install import pipeline
    from greta_install.install import prepare as planning

    parser = argparse.ArgumentParser()
    install.add_arguments(parser)
    args = parser.parse_args(["--save-wheelhouse", str(tmp_path / "wh")])

    class Prepared:
        plan = types.SimpleNamespace(blockers=[], warnings=[])

    monkeypatch.setattr(planning, "prepare", lambda request: Prepared())
    monkeypatch.setattr(install, "_already_installed", lambda p: "all 17 packages match")

    def no_install(*a: object, **k: object) -> None:
        raise AssertionError("it reinstalled")

    monkeypatch.setattr(pipeline, "execute", no_install)
    assert install.run(args) == 2
    assert not (tmp_path / "wh").exists()


def test_version_and_a_summary_that_tells_greta_apart() -> None:
    import greta_core
    from greta_install.version import __version__

    assert greta_core.__version__ == __version__
    data = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    summary = data["project"]["description"]
    assert summary.startswith("GRETA (") and "not the unrelated `greta`" in summary
    assert "urls" not in data["project"]  # no public URL exists: none is made up


def test_bench_results_go_under_the_cache_unless_named(tmp_path: Path, monkeypatch) -> None:
    from greta_core.bench import runner
    from greta_core.commands import bench

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    out = runner.default_out()
    assert out.parent == tmp_path / "cache" / "greta" / "bench"
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    assert parser.parse_args([]).out is None  # not ./greta-bench
    assert parser.parse_args(["--out", "x"]).out == Path("x")


def test_cpu_bench_table_leaves_interpreter_timings_out() -> None:
    from greta_core.bench.report import summary_table

    row = {"op": "softmax", "shape": "8x96", "impl": "greta", "status": "ok",
           "median_ms": 12.3456, "gbps": 0.0, "tflops": 0.0, "speedup_vs_vendor": 0.01,
           "implementation_ran": "reference-torch"}  # fmt: skip
    cpu = summary_table([row], timings=False)
    assert "12.3456" not in cpu and "GB/s" not in cpu and "reference-torch" in cpu
    assert "12.3456" in summary_table([row])


def test_compiling_a_reference_meets_no_lru_cache_wrapper() -> None:
    """`greta bench` compiles the references: dynamo warned once per case about the cached
    namespace lookup in greta_core.reference."""
    import warnings

    import torch

    from greta_core import reference

    torch._dynamo.reset()
    compiled = torch.compile(lambda x: reference.softmax(x), backend="eager")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        compiled(torch.randn(4, 8))
    assert [str(w.message) for w in seen if "lru_cache" in str(w.message)] == []
