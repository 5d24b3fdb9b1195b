"""bench/interleaved.py, the timing rule bench/binding_overhead.py and bench/grad_overhead.py
share: probing, the rotated round order, ratios to the vendor of the same round, the rows
and lines written. binding_overhead's own run needs CUDA; here its cases are stubbed and its
output format checked (no timing asserts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _script_module import load_script

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def rule():
    return load_script("bench/interleaved.py", "interleaved_bench")


def test_rounds_rotate_the_order_and_warm_every_case_first(rule) -> None:
    seen: list[str] = []
    syncs: list[int] = []
    fns = {name: (lambda name=name: seen.append(name)) for name in ("a", "b", "c")}
    out = rule.interleaved_host_us(fns, calls=2, rounds=4, warmup=1, sync=lambda: syncs.append(1))
    assert seen[:3] == ["a", "b", "c"]  # warm-up, one call each
    timed = seen[3:]
    batches = [timed[i] for i in range(0, len(timed), 2)]  # a batch of 2 calls per case
    assert batches == [*"abc", *"bca", *"cab", *"abc"]
    assert all(timed[i] == timed[i + 1] for i in range(0, len(timed), 2))
    assert len(syncs) == 1 + 4 * 3  # after the warm-up and after every batch
    assert {k: len(v) for k, v in out.items()} == {"a": 4, "b": 4, "c": 4}
    assert rule.interleaved_host_us({}, calls=2, rounds=3, warmup=1, sync=lambda: None) == {}


def test_ratio_is_the_median_of_same_round_ratios(rule) -> None:
    per_round = {
        ("norm", "vendor"): [1.0, 2.0, 4.0],
        ("norm", "torch.ops.greta"): [1.5, 2.0, 2.0],  # per round: 1.5, 1.0, 0.5
        ("norm", "raw"): [3.0, 3.0, 3.0],  # 3.0, 1.5, 0.75
        ("solo", "torch.ops.greta"): [1.0, 1.0, 1.0],  # no vendor: no ratio
    }
    assert rule.ratios_to_vendor(per_round, ("torch.ops.greta", "raw"), 2) == {
        "norm": {"torch.ops.greta": 1.0, "raw": 1.5}
    }
    assert rule.ratios_to_vendor(per_round, ("raw",), 3) == {"norm": {"raw": 1.5}}


def test_a_case_that_cannot_run_is_skipped_with_why_and_the_rest_time(rule) -> None:
    def boom() -> None:
        raise RuntimeError("no kernel for this arch")

    rows, runnable = rule.runnable_cases(
        [
            ({"group": "g", "variant": "vendor", "case": "ok"}, lambda: None, ""),
            ({"group": "g", "variant": "raw", "case": "missing"}, None, "not in this tree"),
            ({"group": "g", "variant": "torch.ops.greta", "case": "raises"}, boom, ""),
            ({"group": "h", "variant": "vendor", "case": "built"}, ValueError("bad shape"), ""),
        ],
        sync=lambda: None,
    )
    assert [r.get("skipped") for r in rows] == [
        None,
        "not in this tree",
        "RuntimeError: no kernel for this arch",
        "ValueError: bad shape",
    ]
    assert list(runnable) == [("g", "vendor")]
    rule.add_times(rows, {("g", "vendor"): [3.0, 1.0, 2.0]})
    assert rows[0]["host_us_per_call"] == 2.0 and rows[0]["host_us_min"] == 1.0
    assert "host_us_per_call" not in rows[1]


def test_binding_overhead_appends_a_run_in_its_format(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    import greta_core.bench.metadata as metadata

    bench = load_script("bench/binding_overhead.py", "binding_overhead_bench")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(metadata, "collect", lambda preset, device: {"preset": preset})
    x = torch.ones(4)
    monkeypatch.setattr(bench, "cases", lambda: [
        (("add", "vendor", "torch.add (vendor)"), lambda: torch.add(x, x), ""),
        (("add", "torch.ops.greta", "torch.ops.greta.add"), lambda: x + x, ""),
        (("add", "raw", "greta_core.raw.add"), None, "not in this tree"),
    ])  # fmt: skip
    out = tmp_path / "overhead.json"
    for label in ("before", "after"):
        argv = ["--label", label, "--out", str(out), "--calls", "2", "--rounds", "3"]
        assert bench.main(argv) == 0
    doc = json.loads(out.read_text())
    assert [run["label"] for run in doc["runs"]] == ["before", "after"]
    run = doc["runs"][1]
    assert run["preset"] == "binding_overhead" and (run["calls"], run["rounds"]) == (2, 3)
    vendor, greta, raw = run["results"]
    assert list(vendor) == ["case", "group", "variant", "host_us_per_call", "host_us_min"]
    assert greta["case"] == "torch.ops.greta.add" and greta["host_us_per_call"] > 0
    assert raw == {"case": "greta_core.raw.add", "group": "add", "variant": "raw",
                   "skipped": "not in this tree"}  # fmt: skip
    assert list(run["greta_vs_vendor"]) == ["add"]
    assert list(run["greta_vs_vendor"]["add"]) == ["torch.ops.greta"]
    lines = capsys.readouterr().out.splitlines()
    assert lines[-4].startswith("after    torch.ops.greta.add") and lines[-4].endswith(" us/call")
    assert lines[-3] == "after    greta_core.raw.add" + " " * 25 + "skipped: not in this tree"
    assert lines[-2].startswith("after    host time per call / vendor's, median of 3 rounds")
    assert lines[-1].startswith("after      add            torch.ops.greta=")
