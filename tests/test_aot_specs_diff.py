"""bench/aot_specs_diff.py: the migration check of derived AOT specs against a tree's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _script_module import load_script

pytest.importorskip("triton")


def test_a_tree_against_itself_is_the_same_and_a_change_shows(tmp_path: Path) -> None:
    tool = load_script("bench/aot_specs_diff.py", "aot_specs_diff_bench")
    specs = tool.dump(["vec_add", "swiglu"], ["gfx942"])
    assert {k: len(v) for k, v in specs.items()} == {"gfx942/vec_add": 3, "gfx942/swiglu": 12}
    (tmp_path / "a.json").write_text(json.dumps(specs))
    changed = {**specs, "gfx942/vec_add": specs["gfx942/vec_add"][1:]}
    (tmp_path / "b.json").write_text(json.dumps(changed))
    assert tool.main(["compare", str(tmp_path / "a.json"), str(tmp_path / "a.json")]) == 0
    assert tool.compare(specs, changed) == [
        "same  gfx942/swiglu: 12 specs",
        "DIFF  gfx942/vec_add: 3 -> 2 specs, 1 only before, 0 only after",
    ]
    assert tool.main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 1
