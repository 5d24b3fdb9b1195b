"""bench/route_bound.py: GRETA's training path against torch's op over sizes, and the
largest size up to which torch's op is at least as fast (the format here; the numbers are
the GPU run's business)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from _script_module import load_script

pytest.importorskip("torch")
pytest.importorskip("triton")


@pytest.fixture(scope="module")
def bench():
    return load_script("bench/route_bound.py", "route_bound_bench")


def test_crossover_is_the_last_size_of_the_unbroken_run_where_torch_wins(bench) -> None:
    def rows(*ratios: float) -> list[dict]:
        return [{"op": "x", "elements": 2**i, "greta_vs_vendor": r}
                for i, r in enumerate(ratios)]  # fmt: skip

    assert bench.crossover(rows(1.5, 1.2, 1.0, 0.9, 1.1), "x") == 4  # a later win is noise
    assert bench.crossover(rows(0.9, 1.5), "x") == 0  # GRETA's path wins from the smallest
    assert bench.crossover(rows(1.5, 1.4), "x") == 2  # torch's op at every size measured


def test_tiny_cpu_run_writes_every_op_and_size(
    bench, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GRETA_TRITON_ON_CPU", raising=False)  # the ops' torch references
    plots = []  # matplotlib's import and drawing take seconds: the chart's file is its own
    monkeypatch.setattr(bench, "_plot", lambda results, path: plots.append((results, path)))
    out = tmp_path / "r.json"
    assert bench.main(["--device", "cpu", "--tiny", "--calls", "1", "--rounds", "1", "--warmup", "1",
                       "--out", str(out)]) == 0  # fmt: skip
    doc = json.loads(out.read_text())
    assert doc["preset"] == "route_bound" and doc["device"] == "cpu" and doc["versions"]["torch"]
    sizes = {(r, h) for h in bench.TINY_HIDDEN for r in bench.TINY_ROWS}
    got = {(row["op"], row["rows"], row["hidden"]) for row in doc["results"]}
    assert got == {(op, r, h) for op in bench.OPS for r, h in sizes}
    for row in doc["results"]:
        assert row["elements"] == row["rows"] * row["hidden"]
        assert row["vendor_us"] > 0 and row["greta_us"] > 0
    assert set(doc["crossover_elements"]) == set(bench.OPS)
    with out.with_suffix(".csv").open() as f:
        assert len(list(csv.DictReader(f))) == len(doc["results"])
    assert plots == [(doc["results"], out.with_suffix(".png"))]
