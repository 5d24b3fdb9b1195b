"""The ptxas XLA finds first against the NVIDIA wheels' one: doctor check `cuda.ptxas` and the
smoke test's fix, on fake ptxas scripts, a PATH built here and a fake site-packages layout.

The case it guards (measured on the lent H200, locked CUDA row): Triton 3.9's PTX (ISA 9.4)
assembled by the machine's CUDA 13.0 ptxas fails ("Unsupported .version 9.4; current
version is '9.0'") although the nvidia-cuda-nvcc 13.5 wheel installed a newer ptxas.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _smoke_faults import fault_env, site_packages

from greta_install.detection.system_view import LiveSystem
from greta_install.doctor import collect
from greta_install.doctor.checks import CHECKS
from greta_install.doctor.facts import Facts, InstalledDist
from greta_install.doctor.model import CheckResult
from greta_install.doctor.runner import run_check
from greta_install.environment import ptxas
from greta_install.install import smoke

# Real `ptxas --version` outputs: the system toolkit of the lent H200 (CUDA 13.0) and the
# locked nvidia-cuda-nvcc 13.5.37 wheel's.
PTXAS_13_0 = """ptxas: NVIDIA (R) Ptx optimizing assembler
Copyright (c) 2005-2025 NVIDIA Corporation
Built on Wed_Aug_20_01:53:56_PM_PDT_2025
Cuda compilation tools, release 13.0, V13.0.88
Build cuda_13.0.r13.0/compiler.36424714_0
"""
PTXAS_13_5 = """ptxas: NVIDIA (R) Ptx optimizing assembler
Copyright (c) 2005-2026 NVIDIA Corporation
Built on Tue_Sep_15_19:02:11_PM_PDT_2026
Cuda compilation tools, release 13.5, V13.5.37
Build cuda_13.5.r13.5/compiler.39125733_0
"""
XLA_ERROR = (
    "JaxRuntimeError: INTERNAL: ptxas exited with non-zero error code 65280, output: "
    "ptxas /tmp/tempfile-x, line 5; fatal : Unsupported .version 9.4; current version is '9.0'"
)
CHECK = next(c for c in CHECKS if c.id == "cuda.ptxas")
WITH_JAX = (InstalledDist("jax", "0.12.0"), InstalledDist("jax-triton", "0.4.1"))


def fake_ptxas(folder: Path, output: str, *, exit_code: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "ptxas"
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}EOF\nexit {exit_code}\n")
    path.chmod(0o755)
    return path


def layout(
    tmp_path: Path, wheel: str | None, system: str | None, rel: str = "nvidia/cu13/bin"
) -> tuple[Path, Path, Path]:
    """A site-packages with the wheel's ptxas (unless None) and a system bin folder with the
    toolkit's ptxas (unless None); returns (site, system bin, wheel bin)."""
    site = tmp_path / "site-packages"
    site.mkdir()
    system_bin = tmp_path / "usr-local-cuda" / "bin"
    system_bin.mkdir(parents=True)
    if system is not None:
        fake_ptxas(system_bin, system)
    wheel_bin = site / rel
    if wheel is not None:
        fake_ptxas(wheel_bin, wheel)
    return site, system_bin, wheel_bin


def judge(
    facts: ptxas.PtxasFacts,
    *,
    target: str | None = "cuda",
    dists: tuple[InstalledDist, ...] = WITH_JAX,
) -> CheckResult:
    return run_check(CHECK, Facts(live=True, target=target, dists=dists, ptxas=facts))


def no_toolkit(tmp_path: Path) -> str:
    return str(tmp_path / "no-toolkit")


@pytest.mark.parametrize(
    ("text", "version"),
    [
        (PTXAS_13_0, (13, 0)),
        (PTXAS_13_5, (13, 5)),
        ("Build cuda_13.5.r13.5/compiler.39125733_0\n", (13, 5)),
        ("Cuda compilation tools, release 12.8, V12.8.93\n", (12, 8)),
        ("Cuda compilation tools, release 13.10, V13.10.1\n", (13, 10)),
        ("ptxas fatal   : Value 'sm_100' is not defined for option 'gpu-name'\n", None),
        ("", None),
    ],
)
def test_parse_real_ptxas_version_outputs(text: str, version: tuple[int, int] | None) -> None:
    assert ptxas.parse_version(text) == version


def test_minor_versions_compare_as_numbers() -> None:
    newer = ptxas.parse_version("release 13.10,")
    older = ptxas.parse_version("release 13.9,")
    assert newer is not None and older is not None and newer > older


def test_wheel_newer_than_path_fails_with_the_export_and_the_export_fixes_it(
    tmp_path: Path,
) -> None:
    site, system_bin, wheel_bin = layout(tmp_path, PTXAS_13_5, PTXAS_13_0)
    found = ptxas.collect([site], str(system_bin), no_toolkit(tmp_path))
    assert found.first is not None and found.first.version == (13, 0)
    assert found.wheel is not None and found.wheel.version == (13, 5)
    result = judge(found)
    assert result.status == "fail"
    assert result.fix == f'export PATH="{wheel_bin}:$PATH"'
    assert str(system_bin / "ptxas") in result.finding and "CUDA 13.0" in result.finding
    assert "CUDA 13.5" in result.finding and "first ptxas it finds" in result.finding
    assert "Unsupported .version" in result.finding

    # The PATH the fix leads to: the wheel's folder first. Then nothing is older.
    fixed_path = subprocess.run(
        ["bash", "-c", f'PATH="{system_bin}"; {result.fix}; printf %s "$PATH"'],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    fixed = ptxas.collect([site], fixed_path, no_toolkit(tmp_path))
    assert fixed.first_is_wheel
    after = judge(fixed)
    assert after.status == "ok" and "is the wheel's" in after.finding


def test_without_jax_triton_the_same_finding_is_a_warning(tmp_path: Path) -> None:
    site, system_bin, wheel_bin = layout(tmp_path, PTXAS_13_5, PTXAS_13_0)
    result = judge(
        ptxas.collect([site], str(system_bin), no_toolkit(tmp_path)),
        dists=(InstalledDist("jax", "0.12.0"),),
    )
    assert result.status == "warn" and result.fix == f'export PATH="{wheel_bin}:$PATH"'


def test_path_ptxas_is_a_link_to_the_wheels_one_is_ok(tmp_path: Path) -> None:
    site, _, wheel_bin = layout(tmp_path, PTXAS_13_5, None)
    linked = tmp_path / "links"
    linked.mkdir()
    (linked / "ptxas").symlink_to(wheel_bin / "ptxas")
    found = ptxas.collect([site], str(linked), no_toolkit(tmp_path))
    assert found.first_is_wheel
    result = judge(found)
    assert result.status == "ok" and "CUDA 13.5" in result.finding


def test_a_newer_system_ptxas_is_ok(tmp_path: Path) -> None:
    site, system_bin, _ = layout(tmp_path, PTXAS_13_0, PTXAS_13_5)
    result = judge(ptxas.collect([site], str(system_bin), no_toolkit(tmp_path)))
    assert result.status == "ok" and "not older" in result.finding


def test_no_ptxas_on_path_the_toolkit_folder_is_what_xla_finds(tmp_path: Path) -> None:
    site, system_bin, wheel_bin = layout(tmp_path, PTXAS_13_5, PTXAS_13_0)
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    found = ptxas.collect([site], str(empty), str(system_bin))
    assert found.first is None and found.toolkit is not None
    result = judge(found)
    assert result.status == "fail" and "PATH has none" in result.finding
    assert result.fix == f'export PATH="{wheel_bin}:$PATH"'


def test_no_ptxas_anywhere_but_the_wheel_is_ok(tmp_path: Path) -> None:
    site, _, _ = layout(tmp_path, PTXAS_13_5, None)
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    result = judge(ptxas.collect([site], str(empty), no_toolkit(tmp_path)))
    assert result.status == "ok" and "none comes before" in result.finding


def test_cuda_12_wheel_layout_is_found(tmp_path: Path) -> None:
    site, system_bin, wheel_bin = layout(
        tmp_path, "Cuda compilation tools, release 12.9, V12.9.86\n",
        "Cuda compilation tools, release 12.4, V12.4.131\n", rel="nvidia/cuda_nvcc/bin",
    )  # fmt: skip
    result = judge(ptxas.collect([site], str(system_bin), no_toolkit(tmp_path)))
    assert result.status == "fail" and result.fix == f'export PATH="{wheel_bin}:$PATH"'


def test_no_wheel_is_not_applicable_and_says_where_it_looked(tmp_path: Path) -> None:
    site, system_bin, _ = layout(tmp_path, None, PTXAS_13_0)
    result = judge(ptxas.collect([site], str(system_bin), no_toolkit(tmp_path)))
    assert result.status == "skip"
    assert str(site / "nvidia" / "cu13" / "bin") in result.finding
    assert "nothing to compare" in result.finding and "CUDA 13.0" in result.finding


def test_unparsable_output_is_said_honestly(tmp_path: Path) -> None:
    site, system_bin, wheel_bin = layout(tmp_path, PTXAS_13_5, "ptxas: a wrapper of some kind\n")
    result = judge(ptxas.collect([site], str(system_bin), no_toolkit(tmp_path)))
    assert result.status == "warn"
    assert "cannot tell" in result.finding and "a wrapper of some kind" in result.finding
    assert result.fix == f'export PATH="{wheel_bin}:$PATH"'


def test_a_ptxas_that_fails_or_hangs_is_reported_not_raised(tmp_path: Path) -> None:
    broken = fake_ptxas(tmp_path / "broken", "", exit_code=3)
    said = ptxas.probe(str(broken))
    assert said.version is None and "exited 3" in (said.error or "")
    hang = tmp_path / "hang" / "ptxas"
    hang.parent.mkdir()
    hang.write_text("#!/bin/sh\nexec sleep 30\n")
    hang.chmod(0o755)
    slow = ptxas.probe(str(hang), timeout=0.5)
    assert slow.version is None and "did not answer" in (slow.error or "")


@pytest.mark.parametrize("target", ["mi300x", "radeon", "cpu", None])
def test_elsewhere_it_says_it_did_not_apply(target: str | None, tmp_path: Path) -> None:
    site, system_bin, _ = layout(tmp_path, PTXAS_13_5, PTXAS_13_0)
    result = judge(ptxas.collect([site], str(system_bin), no_toolkit(tmp_path)), target=target)
    assert result.status == "skip"
    assert "cuda target only" in result.finding and "no ptxas was looked at" in result.finding


def test_without_jax_nothing_is_compared(tmp_path: Path) -> None:
    site, system_bin, _ = layout(tmp_path, PTXAS_13_5, PTXAS_13_0)
    result = judge(ptxas.collect([site], str(system_bin), no_toolkit(tmp_path)), dists=())
    assert result.status == "skip" and "jax is not installed" in result.finding


def test_snapshot_and_uncollected_skip() -> None:
    assert run_check(CHECK, Facts(live=False, target="cuda")).status == "skip"
    uncollected = run_check(CHECK, Facts(live=True, target="cuda", dists=WITH_JAX))
    assert uncollected.status == "skip" and "not collected" in uncollected.finding


def test_the_export_line_survives_awkward_folder_names(tmp_path: Path) -> None:
    folder = tmp_path / 'we"ird $HOME `x` \\ dir'
    line = ptxas.export_line(str(folder))
    out = subprocess.run(
        ["bash", "-c", f'PATH=/usr/bin:/bin; {line}; printf %s "$PATH"'],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert out == f"{folder}:/usr/bin:/bin"


def test_wheel_dir_command_prints_this_environments_folder(tmp_path: Path) -> None:
    python = fault_env(tmp_path / "env", "none")
    repo = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(repo)}
    argv = [python, "-m", "greta_install.environment.ptxas", "--wheel-dir"]
    absent = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    assert absent.returncode == 1 and absent.stdout == ""
    wheel_bin = site_packages(tmp_path / "env") / "nvidia" / "cu13" / "bin"
    fake_ptxas(wheel_bin, PTXAS_13_5)
    present = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    assert present.returncode == 0 and Path(present.stdout.strip()) == wheel_bin


def test_the_doctor_collects_it_on_the_cuda_target_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`greta doctor`'s collection, live: this process's PATH and site-packages (both
    replaced by fakes here), the probes stubbed out (they are not what is tested)."""
    site, system_bin, wheel_bin = layout(tmp_path, PTXAS_13_5, PTXAS_13_0)
    monkeypatch.setenv("PATH", f"{system_bin}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setattr(ptxas, "this_site_dirs", lambda: [site])
    quiet = lambda section: [sys.executable, "-c", "pass"]  # noqa: E731
    facts = collect.collect_facts(LiveSystem(), target="cuda", probe_command=quiet)
    assert facts.ptxas is not None
    assert facts.ptxas.first == ptxas.Ptxas(str(system_bin / "ptxas"), (13, 0))
    assert facts.ptxas.wheel_dir == str(wheel_bin)
    result = run_check(CHECK, dataclasses.replace(facts, dists=WITH_JAX))
    assert result.status == "fail" and result.fix == f'export PATH="{wheel_bin}:$PATH"'
    elsewhere = collect.collect_facts(LiveSystem(), target="cpu", probe_command=quiet)
    assert elsewhere.ptxas is None
    assert run_check(CHECK, elsewhere).status == "skip"


# --- the smoke test's message ---------------------------------------------------------------


def test_smoke_message_names_the_export_for_an_old_ptxas() -> None:
    steps = [
        smoke.Step("jax", "passed", 0.1),
        smoke.Step("greta-jax", "failed", 0.1, None, XLA_ERROR),
    ]
    report = smoke.SmokeReport("gpu", steps, returncode=1, planned=["jax", "greta-jax"])
    report.ptxas_dir = "/env/site-packages/nvidia/cu13/bin"
    message = report.failure_message()
    assert "step 'greta-jax' failed" in message and "doctor: cuda.ptxas" in message
    assert 'fix: export PATH="/env/site-packages/nvidia/cu13/bin:$PATH"' in message
    # No wheel found: the doctor check names what to do instead of a made-up folder.
    report.ptxas_dir = None
    assert "fix: greta doctor" in report.failure_message()
    assert "export PATH" not in report.failure_message()


def test_other_failures_keep_their_fix() -> None:
    steps = [smoke.Step("greta-jax", "failed", 0.1, None, "ValueError: out_type mismatch")]
    report = smoke.SmokeReport("gpu", steps, returncode=1, planned=["greta-jax"])
    assert not report.old_ptxas
    assert "doctor: jax.jax_triton" in report.failure_message()


def test_run_smoke_finds_the_wheel_folder_of_the_environment_under_test(tmp_path: Path) -> None:
    """A jax whose first use fails as XLA does with an old ptxas: run_smoke looks up the
    ptxas folder of the environment under test (not of the installer's). torch is broken
    ("crash") so the child is quick and the same wherever the suite runs."""
    python = fault_env(
        tmp_path / "env", "crash", {"jax/__init__.py": f"raise RuntimeError({XLA_ERROR!r})\n"}
    )
    wheel_bin = site_packages(tmp_path / "env") / "nvidia" / "cu13" / "bin"
    fake_ptxas(wheel_bin, PTXAS_13_5)
    report = smoke.run_smoke(python, "cpu")
    jax_step = next(s for s in report.steps if s.name == "jax")
    assert jax_step.failed and "Unsupported .version" in (jax_step.error or "")
    assert report.old_ptxas
    assert report.ptxas_dir is not None and Path(report.ptxas_dir) == wheel_bin

    # Without the ptxas error, no folder is looked up.
    plain = fault_env(tmp_path / "plain", "crash")
    fake_ptxas(site_packages(tmp_path / "plain") / "nvidia" / "cu13" / "bin", PTXAS_13_5)
    other = smoke.run_smoke(plain, "cpu")
    assert not other.ok and not other.old_ptxas and other.ptxas_dir is None
