"""bench/grad_overhead.py --device cpu --tiny: forward+backward host time per op, GRETA
beside the PyTorch eager op, written as JSON and CSV with metadata (the numbers themselves
are the GPU run's business; here the format and that every op ran its backward)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from _script_module import load_script

pytest.importorskip("torch")
pytest.importorskip("triton")

GROUPS = {"rms_norm", "add_rms_norm", "layer_norm", "rope", "swiglu", "geglu", "softmax",
          "linear_cross_entropy", "attention", "matmul"}  # fmt: skip


def test_tiny_cpu_run_writes_every_op(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRETA_TRITON_ON_CPU", raising=False)  # the ops' torch references
    bench = load_script("bench/grad_overhead.py", "grad_overhead_bench")
    out = tmp_path / "grad.json"
    argv = ["--device", "cpu", "--tiny", "--calls", "2", "--rounds", "2", "--warmup", "1",
            "--out", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["preset"] == "grad_overhead" and doc["device"] == "cpu" and doc["tiny"] is True
    assert doc["versions"]["torch"] and doc["date"]
    rows = {(r["group"], r["variant"]): r for r in doc["results"]}
    for group in GROUPS:
        for variant in ("vendor", "torch.ops.greta"):
            row = rows[(group, variant)]
            assert "skipped" not in row, row
            assert row["host_us_per_call"] > 0 and row["host_us_min"] <= row["host_us_per_call"]
        greta = rows[(group, "torch.ops.greta")]
        assert greta["ratio_to_vendor"] == doc["greta_vs_vendor"][group] > 0
        assert greta["within_target"] == (greta["ratio_to_vendor"] <= doc["target"])
    # The Python entries beside torch.ops.greta, for every declared op with a front.
    entries = {group for group, variant in rows if variant == bench.ENTRY}
    assert GROUPS - {"linear_cross_entropy"} <= entries
    for group in entries:
        row = rows[(group, bench.ENTRY)]
        assert "skipped" not in row and row["ratio_to_vendor"] == doc["entry_vs_vendor"][group]
    assert rows[("kv_cache", "torch.ops.greta")]["skipped"].startswith("no backward")
    with out.with_suffix(".csv").open() as f:
        table = list(csv.DictReader(f))
    assert tuple(table[0]) == bench.CSV_FIELDS
    assert len(table) == len(doc["results"])


def test_a_step_differentiates_every_input() -> None:
    import torch

    bench = load_script("bench/grad_overhead.py", "grad_overhead_bench")
    x = torch.randn(3, requires_grad=True)
    w = torch.randn(3, requires_grad=True)
    gx, gw = bench._step(lambda a, b, s: a * b * s, (x, w), (2.0,))()
    torch.testing.assert_close(gx, 2.0 * w.detach())
    torch.testing.assert_close(gw, 2.0 * x.detach())


def test_config_serves_keys_over_the_tables_for_the_run(tmp_path: Path) -> None:
    """--config: a JSON object (inline or a file) that configs.Override serves for the run
    (the shipped tables leave the norms' one-launch backward off); bad JSON is a one-line
    usage error before anything runs."""
    from greta_core import configs

    bench = load_script("bench/grad_overhead.py", "grad_overhead_bench")
    assert bench.config_override(None) is None
    mapping = bench.config_override('{"norm_bwd_reduce": {"MAX_PARTIALS": 64}}')
    assert mapping == {"norm_bwd_reduce": {"MAX_PARTIALS": 64}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(mapping))
    assert bench.config_override(str(path)) == mapping
    with pytest.raises(ValueError, match="not valid JSON"):
        bench.config_override("{oops")
    with pytest.raises(ValueError, match="must map op names to objects"):
        bench.config_override('{"norm_bwd_reduce": 1}')
    assert configs.lookup("norm_bwd_reduce", "sm_90")["MAX_PARTIALS"] == 0
    with bench.overridden(mapping):
        assert configs.lookup("norm_bwd_reduce", "sm_90")["MAX_PARTIALS"] == 64
    assert configs.lookup("norm_bwd_reduce", "sm_90")["MAX_PARTIALS"] == 0
    with pytest.raises(SystemExit) as exc:
        bench.main(["--config", "{oops", "--out", str(tmp_path / "g.json")])
    assert exc.value.code == 2 and not (tmp_path / "g.json").exists()
