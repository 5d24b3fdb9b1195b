"""Detection, the install plan and the doctor agree about every arch of the matrix.

All three read greta_install/archs.py (override, whether GRETA may set it, the arch
whose code runs, warnings); this test holds them together for every arch of every AMD
target, on every row, so a fact cannot drift in one of them again.
"""

from __future__ import annotations

import pytest

from greta_install import archs
from greta_install.doctor.checks.gpu import needed_override
from greta_install.doctor.facts import Facts
from greta_install.doctor.gfx import SIBLING_OVERRIDES, UNOFFICIAL_OVERRIDES
from greta_install.lockfile import load_lock
from greta_install.matrix import load_matrix
from greta_install.model import Detection, Gpu
from greta_install.plan import build_plan

MATRIX = load_matrix()
AMD_CASES = [
    (target, arch, row)
    for target in ("mi300x", "instinct", "radeon")
    for arch in MATRIX.target(target).archs
    for row in MATRIX.generations(target)
]


def _detection(target: str, arch: str) -> Detection:
    gpu = Gpu(vendor="amd", arch=arch, product=None, pci_id=None, evidence=("kfd",))
    return Detection(target=target, primary=0, gpus=[gpu])


@pytest.mark.parametrize(("target", "arch", "row"), AMD_CASES)
def test_detect_plan_and_doctor_agree(target: str, arch: str, row: str) -> None:
    # Detection routes the arch to the target whose row lists it.
    assert archs.target_for_gfx(arch) == target
    wheel_archs = MATRIX.row(target, "3.12", row).torch_archs
    decision = archs.decide_override(arch, wheel_archs)
    # The plan sets exactly the override archs.py decides for this row's wheels...
    plan = build_plan(MATRIX, load_lock(target, "3.12", row), detection=_detection(target, arch))
    assert plan.env.get("HSA_OVERRIDE_GFX_VERSION") == decision.value
    assert plan.kernel_arch == (decision.kernel_arch or arch)
    assert plan.kernel_wheel.arch == plan.kernel_arch
    # ...the doctor expects the same one for an environment holding those wheels...
    facts = Facts(live=True, target=target, detection=_detection(target, arch))
    facts.wheel_archs = wheel_archs
    assert needed_override(facts) == decision.value
    # ...and every warning archs.py has for the arch reaches the plan.
    for warning in decision.warnings:
        assert warning in plan.warnings
    # The current rows run every arch natively: no override anywhere.
    if row == "current":
        assert decision.value is None and decision.native
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
