"""Detection, the install plan, the doctor, the kernel build and the runtime agree on
every arch of the matrix.

All of them read greta_install/archs.py (the one arch table: family, wave size, target,
override policy, known-bad gate, tuned table, and which torch build carries which arch).
This test holds them together for every arch of every target, so a fact cannot drift in
one of them again.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from greta_core import arch as runtime_arch
from greta_core.kernel_wheels import aot
from greta_install import archs, kernel_names
from greta_install.doctor.checks.gpu import needed_override
from greta_install.doctor.facts import Facts
from greta_install.doctor.gfx import SIBLING_OVERRIDES, UNOFFICIAL_OVERRIDES
from greta_install.install import kernel_build
from greta_install.locks import routing
from greta_install.locks.lockfile import load_lock
from greta_install.locks.matrix import load_matrix
from greta_install.model import Detection, Gpu
from greta_install.plan.install_plan import build_plan

MATRIX = load_matrix()
TABLES = Path(runtime_arch.__file__).parent / "configs" / "tables"
GPU_CASES = [
    (target, arch)
    for target, spec in MATRIX.targets.items()
    if spec.kernel_wheel
    for arch in spec.archs
]
AMD_ROW_CASES = [
    (target, arch, row)
    for target, arch in GPU_CASES
    if arch.startswith("gfx")
    for row in MATRIX.generations(target)
]


def _detection(target: str, arch: str) -> Detection:
    vendor = "amd" if arch.startswith("gfx") else "nvidia"
    gpu = Gpu(vendor=vendor, arch=arch, product=None, pci_id=None, evidence=("kfd",))
    return Detection(target=target, primary=0, gpus=[gpu])


def test_every_matrix_arch_has_one_row() -> None:
    for target, arch in GPU_CASES:
        facts = archs.arch_facts(arch)
        assert facts.family is not None, arch
        assert facts.target == target, arch
    # And every row's torch build is a record of the table, with its evidence.
    for row in MATRIX.rows():
        build = archs.torch_build(row.torch_build)
        assert row.torch_archs == build.archs
        assert build.archs == () or all(u.startswith("https://") for u in build.evidence)


@pytest.mark.parametrize(("target", "arch"), GPU_CASES)
def test_detect_plan_doctor_kernel_build_and_runtime_agree(target: str, arch: str) -> None:
    facts = archs.arch_facts(arch)
    # Detection: an AMD arch goes to the target the table names.
    if arch.startswith("gfx"):
        assert archs.target_for_gfx(arch) == target
    # Plan: routing picks a row whose torch build carries the arch; the plan says so.
    route = routing.route(MATRIX, target, arch)
    lock = load_lock(target, "3.12", route.row)
    plan = build_plan(MATRIX, lock, detection=_detection(target, arch), allow_known_bad=True)
    assert plan.torch_source is not None and plan.torch_source.carries_arch is True
    assert arch in MATRIX.row(target, "3.12", route.row).torch_archs
    # A native build exists, so no override is ever set automatically.
    assert "HSA_OVERRIDE_GFX_VERSION" not in plan.env
    assert plan.kernel_arch == arch
    # Doctor: for that row's wheels it expects no override either.
    doctor = Facts(live=True, target=target, detection=_detection(target, arch))
    doctor.wheel_archs = MATRIX.row(target, "3.12", route.row).torch_archs
    assert needed_override(doctor) is None
    # Kernel build: the plan's kernel wheel is the arch's, built with the arch's name.
    assert plan.kernel_wheel.arch == arch
    assert plan.kernel_wheel.requirement is not None
    assert plan.kernel_wheel.requirement.startswith(kernel_names.distribution_name(arch) + "==")
    argv = kernel_build.build_argv("python", arch, "out")
    assert argv[argv.index("--arch") + 1] == arch
    # Runtime: wave size, matrix-unit family and tuned table come from the same row.
    assert runtime_arch.warp_size(arch) == facts.wave
    expected_family = "cuda" if arch.startswith("sm_") else "cdna" if facts.wave == 64 else "rdna"
    assert aot.matrix_family(arch) == expected_family
    assert (arch in runtime_arch.TUNED_ARCHS) == (facts.tuned_table is not None)
    # Every arch the plan builds a wheel for is served by the runtime, tuned table or not.
    assert arch in kernel_names.wheel_archs()
    if facts.tuned_table:
        assert (TABLES / f"{facts.tuned_table}.json").is_file()
    # Gate: a known-bad arch is refused unless asked for, with its evidence.
    gated = build_plan(MATRIX, lock, detection=_detection(target, arch))
    assert bool(gated.blockers) is bool(facts.known_bad)
    for url in facts.known_bad_evidence:
        assert any(url in b for b in gated.blockers)


def test_tuned_tables_on_disk_are_exactly_the_table_rows() -> None:
    on_disk = {p.stem for p in TABLES.glob("*.json")} - {"default"}
    assert on_disk == set(archs.TUNED_ARCHS)


@pytest.mark.parametrize(("target", "arch", "row"), AMD_ROW_CASES)
def test_plan_and_doctor_agree_on_every_row(target: str, arch: str, row: str) -> None:
    wheel_archs = MATRIX.row(target, "3.12", row).torch_archs
    decision = archs.decide_override(arch, wheel_archs)
    plan = build_plan(
        MATRIX,
        load_lock(target, "3.12", row),
        detection=_detection(target, arch),
        allow_known_bad=True,
    )
    assert plan.env.get("HSA_OVERRIDE_GFX_VERSION") == decision.value
    assert plan.kernel_arch == (decision.kernel_arch or arch)
    assert plan.kernel_wheel.arch == plan.kernel_arch
    facts = Facts(live=True, target=target, detection=_detection(target, arch))
    facts.wheel_archs = wheel_archs
    assert needed_override(facts) == decision.value
    for warning in decision.warnings:
        assert warning in plan.warnings
    # The plan says whether the row's build carries the arch.
    assert plan.torch_source is not None
    assert plan.torch_source.carries_arch is (arch in wheel_archs)
    # Never set automatically on gfx1103 / gfx115x (hangs reported), on any row.
    if arch == "gfx1103" or arch.startswith("gfx115"):
        assert decision.value is None


@pytest.mark.parametrize("arch", sorted(archs.FAMILY))
def test_doctor_tables_are_derived_from_archs(arch: str) -> None:
    facts = archs.arch_facts(arch)
    assert SIBLING_OVERRIDES.get(arch) == facts.override
    assert (arch in UNOFFICIAL_OVERRIDES) == bool(facts.override and not facts.auto_override)
    if facts.override:
        assert archs.override_to_gfx(facts.override) == facts.runs_as
        assert archs.family(facts.runs_as) == archs.family(arch)  # a same-family sibling


def test_native_code_always_wins_over_an_override() -> None:
    assert archs.decide_override("gfx1031", ("gfx1030", "gfx1031")).value is None
    assert archs.decide_override("gfx1031", ("gfx1030",)).value == "10.3.0"
    # A known override whose sibling the wheels lack is useless: not set, and said so.
    lacking = archs.decide_override("gfx1031", ("gfx1100",))
    assert lacking.value is None and lacking.warnings
