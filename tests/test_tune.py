"""Pure parts of `greta tune`: candidate grids and turning timings into a table entry."""

from __future__ import annotations

from greta_core.bench.tune import (
    SPACES,
    OpSpace,
    Problem,
    best_per_problem,
    build_entry,
    candidates,
    config_label,
    merge_table,
)


def _problem(label: str, m: int) -> Problem:
    return Problem(label, {"M": m}, lambda torch, device: lambda: None)


def test_hip_knobs_only_on_amd() -> None:
    space = SPACES["matmul"]
    cuda = candidates(space, is_hip=False)
    hip = candidates(space, is_hip=True)
    assert cuda and all("waves_per_eu" not in c for c in cuda)
    assert all(c["matrix_instr_nonkdim"] == 16 for c in hip)
    assert len(hip) == 2 * len(cuda)  # waves_per_eu in {0, 2}
    assert all(space.valid(c) for c in cuda)


def test_best_ignores_failed_candidates() -> None:
    timings = {
        "small": {"a": float("inf"), "b": 2.0, "c": float("nan")},
        "big": {"a": 1.0, "b": 3.0},
    }
    assert best_per_problem(timings) == {"small": "b", "big": "a"}
    assert best_per_problem({"x": {"a": float("inf")}}) == {}


def test_entry_has_default_from_largest_and_rules_for_smaller() -> None:
    problems = [_problem("big", 4096), _problem("small", 64), _problem("mid", 1024)]
    fast, slow = {"BLOCK_M": 128}, {"BLOCK_M": 32}
    entry = build_entry(problems, {"big": fast, "mid": fast, "small": slow}, "M")
    assert entry == {"default": fast, "rules": [{"when": {"M_max": 64}, "config": slow}]}
    assert build_entry(problems, {"big": fast}, "M") == {"default": fast}


def test_merge_keeps_other_ops() -> None:
    table = {
        "arch": "sm_90",
        "ops": {"vec_add": {"default": {"BLOCK": 1}}, "matmul": {"default": {}}},
    }
    out = merge_table(table, "matmul", {"default": {"BLOCK_M": 64}}, "tuned")
    assert out["ops"]["vec_add"] == {"default": {"BLOCK": 1}}
    assert out["ops"]["matmul"] == {"comment": "tuned", "default": {"BLOCK_M": 64}}
    assert table["ops"]["matmul"] == {"default": {}}  # input untouched


def test_labels_are_stable() -> None:
    assert config_label({"b": 2, "a": 1}) == "a=1,b=2"
    space = OpSpace("x", {"a": [1, 2], "b": [3]}, [], valid=lambda c: c["a"] != 2)
    assert candidates(space, is_hip=False) == [{"a": 1, "b": 3}]


def test_dump_table_round_trips_one_line_per_op() -> None:
    import json

    from greta_core.bench.tune import dump_table

    table = {"arch": "sm_90", "ops": {"a": {"default": {"X": 1}}, "b": {"default": {}}}}
    text = dump_table(table)
    assert json.loads(text) == table
    assert '    "a": {"default": {"X": 1}},' in text.splitlines()
