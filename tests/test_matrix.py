"""The version matrix: the committed one is valid and every row is self-consistent."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.version import Version

from greta_install.locks.matrix import TRITON_DISTRIBUTIONS, MatrixError, load_matrix, parse_matrix

REPO = Path(__file__).resolve().parent.parent
MATRIX_TEXT = (REPO / "lock" / "matrix.toml").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def matrix():
    return load_matrix(REPO / "lock" / "matrix.toml")


def test_required_targets_and_pythons(matrix) -> None:
    assert {"mi300x", "radeon", "cuda", "cpu"} <= set(matrix.targets)
    assert set(matrix.pythons) == {"3.11", "3.12", "3.13"}


def test_packaged_matrix_is_the_repository_one(matrix) -> None:
    assert load_matrix() == matrix


def rows(matrix):
    return matrix.rows()


def test_every_row_pins_torch_one_triton_jax_numpy(matrix) -> None:
    for row in matrix.rows():
        names = [p.name for p in row.pins]
        assert len(names) == len(set(names)), row
        tritons = [p for p in row.pins if p.name in TRITON_DISTRIBUTIONS or "triton" in p.provides]
        assert len(tritons) == 1, (row.target, row.python, tritons)
        for role in ("torch", "jax", "jaxlib", "numpy"):
            assert len(row.by_role(role)) == 1, (row.target, row.python, role)


def test_jax_family_versions_equal(matrix) -> None:
    for row in matrix.rows():
        jax = Version(row.one("jax").version)
        family = [p for p in row.pins if p.role in ("jaxlib", "jax-plugin", "jax-pjrt")]
        if matrix.targets[row.target].kernel_wheel:
            assert {p.role for p in family} == {"jaxlib", "jax-plugin", "jax-pjrt"}
        for pin in family:
            assert Version(pin.version).release == jax.release, (row.target, row.python, pin)
        if Version(row.python) < Version("3.12"):
            assert jax < Version("0.11"), "jax >= 0.11 needs Python >= 3.12"


def test_torch_local_version_matches_its_index(matrix) -> None:
    expected_local = {
        "mi300x": r"rocm\d+\.\d+",
        "radeon": r"rocm\d+\.\d+",
        "cuda": r"cu\d+",
        "cpu": r"cpu",
    }
    for row in matrix.rows():
        torch = row.one("torch")
        local = Version(torch.version).local
        if torch.index is None:
            # The default index's torch (cuda's current build; cpu on Python 3.13, where no
            # +cpu wheel installs on the CI machine) has no local version.
            assert local is None and (row.target == "cuda" or row.python == "3.13"), torch
            continue
        if row.generation == "therock":
            # AMD's multi-arch index serves +rocmX.Y.Z builds of every ROCm version.
            assert local and re.fullmatch(r"rocm\d+\.\d+\.\d+", local), torch
            assert torch.index == "https://repo.amd.com/rocm/whl-multi-arch", torch
            continue
        if row.target in expected_local:
            assert local and re.fullmatch(expected_local[row.target], local), torch
        assert torch.index == f"https://download.pytorch.org/whl/{local}", torch


def test_torch_requirements_are_met_by_the_row(matrix) -> None:
    from packaging.requirements import Requirement

    for row in matrix.rows():
        torch = row.one("torch")
        triton = row.one("triton")
        for text in torch.requires:
            req = Requirement(text)
            if req.name in TRITON_DISTRIBUTIONS:
                assert req.name == triton.name
                assert req.specifier.contains(triton.version)


def test_cuda_previous_row_matches_the_gpu_test_machine(matrix) -> None:
    row = matrix.row("cuda", "3.12", "previous")
    got = {p.name: p.version for p in row.pins}
    assert got["torch"] == "2.11.0+cu130"
    assert got["triton"] == "3.6.0"
    assert got["jax"] == got["jax-cuda13-plugin"] == got["jax-cuda13-pjrt"] == "0.11.2"
    assert got["jax-triton"] == "0.3.1"
    current = {p.name: p.version for p in matrix.row("cuda", "3.12").pins}
    assert current["torch"] == "2.15.0" and current["triton"] == "3.9.0"
    assert current["jax-triton"] == "0.4.1"


def test_gpu_rows_are_current_and_keep_the_previous_generation(matrix) -> None:
    newest = {"mi300x": (2, 14), "radeon": (2, 14), "instinct": (2, 14), "cuda": (2, 15)}
    for target, release in newest.items():
        amd = target != "cuda"
        assert matrix.generations(target) == (
            ("current", "therock", "previous") if amd else ("current", "previous")
        )
        for py in matrix.pythons:
            torch = matrix.row(target, py).one("torch")
            assert Version(torch.version).release[:2] == release, torch
            old = matrix.row(target, py, "previous").one("torch")
            assert Version(old.version) < Version(torch.version)
    # The cpu row stays installable where CI runs (the newest CPU build served there).
    assert matrix.generations("cpu") == ("current",)


def test_rocm_rows_hold_one_triton_module_for_torch_jax_and_jax_triton(matrix) -> None:
    for gen in ("current", "previous"):
        row = matrix.row("mi300x", "3.12", gen)
        tritons = [p for p in row.pins if p.role == "triton"]
        assert [p.name for p in tritons] == ["triton-rocm"] and "triton" in tritons[0].provides
        jt = row.one("jax-triton")
        assert jt is not None and jt.name == "jax-triton"


def test_attested_hashes_name_their_source(matrix) -> None:
    attested = [
        p
        for spec in matrix.targets.values()
        for p in (*spec.pins, *(spec.previous.pins if spec.previous else ()))
        if p.hashes
    ]
    assert {p.name for p in attested} >= {"torch", "triton-rocm", "rocm"}
    for pin in attested:
        assert pin.hash_source and len(pin.hash_source) > 30, pin


def test_hashes_without_a_source_are_rejected() -> None:
    bad = MATRIX_TEXT.replace(
        'hash_source = "rocm-7.14.0.tar.gz', 'hash_sourcex = "rocm-7.14.0.tar.gz', 1
    )
    with pytest.raises(MatrixError, match="needs `hash_source`"):
        parse_matrix(bad)


def test_every_pin_names_its_source(matrix) -> None:
    for spec in matrix.targets.values():
        for pin in (*spec.pins, *(spec.previous.pins if spec.previous else ())):
            assert len(pin.source) > 20, pin


def _broken(old: str, new: str) -> str:
    assert old in MATRIX_TEXT, old
    return MATRIX_TEXT.replace(old, new, 1)


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            'name = "jaxlib"\nrole = "jaxlib"\nversion = "0.11.2"',
            'name = "jaxlib"\nrole = "jaxlib"\nversion = "0.11.1"',
            "must equal jax",
        ),
        (
            'version = "2.11.0+rocm7.2"\nindex = "https://download.pytorch.org/whl/rocm7.2"',
            'version = "2.11.0+rocm7.2"\nindex = "https://download.pytorch.org/whl/cu130"',
            "must come from a .../whl/rocm7.2",
        ),
        (
            'version = "2.13.0+cpu"\nindex = "https://download.pytorch.org/whl/cpu"',
            'version = "2.13.0+cpu"\nindex = "https://download.pytorch.org/whl/rocm7.2"',
            "whl/cpu",
        ),
        (
            'name = "triton-rocm"\nrole = "triton"\nversion = "3.6.0"',
            'name = "triton-rocm"\nrole = "triton"\nversion = "3.5.1"',
            "requires triton-rocm==3.6.0",
        ),
        (
            'version = "0.10.2"\npythons = ["3.11"]\nsource = "Default index: 0.10.2 is the last jax for Python 3.11 (pip',
            'version = "0.11.2"\npythons = ["3.11"]\nsource = "Default index: 0.10.2 is the last jax for Python 3.11 (pip',
            "needs Python >= 3.12",
        ),
        ("schema = 1", "schema = 7", "schema"),
        ('role = "numpy"', 'role = "nunpy"', "is not one of"),
    ],
)
def test_rule_violations_are_reported(old: str, new: str, message: str) -> None:
    with pytest.raises(MatrixError) as err:
        parse_matrix(_broken(old, new), "broken.toml")
    assert message in str(err.value)
    assert "broken.toml" in str(err.value)


def test_second_triton_distribution_is_rejected() -> None:
    extra = '\n[[targets.mi300x.pins]]\nname = "triton"\nrole = "extra"\nversion = "3.6.0"\npythons = ["3.12"]\nsource = "a second triton distribution, which breaks the import package"\n'
    with pytest.raises(MatrixError, match="second distribution providing `triton`"):
        parse_matrix(MATRIX_TEXT + extra)


def test_corrupt_toml_gives_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "matrix.toml"
    bad.write_text(MATRIX_TEXT[: len(MATRIX_TEXT) // 2] + "\n[[[ nonsense", encoding="utf-8")
    with pytest.raises(MatrixError, match="is not valid TOML"):
        load_matrix(bad)
    with pytest.raises(MatrixError, match="cannot read"):
        load_matrix(tmp_path / "absent.toml")


def test_missing_target_is_reported() -> None:
    start = MATRIX_TEXT.index("[targets.cpu]")
    with pytest.raises(MatrixError, match="target 'cpu' is missing"):
        parse_matrix(MATRIX_TEXT[:start])
