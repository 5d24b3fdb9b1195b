"""bench/decode_ab.py --tiny: vanilla and apply_greta decode in alternating rounds, one model."""

from __future__ import annotations

import csv
import json
import statistics
import sys
from pathlib import Path

import pytest
from _script_module import load_script

pytest.importorskip("torch")
pytest.importorskip("transformers")

BENCH = Path(__file__).resolve().parents[1] / "bench" / "decode_ab.py"


def _load():
    sys.path.insert(0, str(BENCH.parent))  # decode_ab imports hf_llama beside it
    return load_script("bench/decode_ab.py", "decode_ab_bench")


def test_tiny_run_alternates_forms_and_leaves_no_patch(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("GRETA_TRITON_ON_CPU", raising=False)  # the ops' torch references
    from greta_core.transformers.apply import patched_targets

    before = patched_targets()  # another test on this worker may have left its own patches
    bench = _load()
    argv = ["--tiny", "--rounds", "3", "--tokens", "3", "--prompt", "4", "--out", str(tmp_path)]
    assert bench.main(argv) == 0
    doc = json.loads((tmp_path / "decode_ab.json").read_text())
    assert doc["metadata"]["preset"] == "decode_ab" and doc["metadata"]["device"] == "cpu"
    rounds = doc["rounds"]
    assert [r["order"] for r in rounds] == [
        ["vanilla", "greta"],
        ["greta", "vanilla"],
        ["vanilla", "greta"],
    ]
    ratios = [r["greta"] / r["vanilla"] for r in rounds]
    assert doc["greta_vs_vanilla"] == pytest.approx(statistics.median(ratios), abs=1e-3)
    assert doc["vanilla_tok_s"] == statistics.median(r["vanilla"] for r in rounds)
    # GRETA's form ran GRETA's ops; the reverted form none of them (no patch left behind).
    assert doc["implementations"]["vanilla"] == {}
    assert {"rms_norm", "rope", "attention", "swiglu"} <= set(doc["implementations"]["greta"])
    assert patched_targets() == before
    with (tmp_path / "decode_ab.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [float(r["greta_vs_vanilla"]) for r in rows] == pytest.approx(ratios, abs=1e-3)
    assert "<out>" in doc["command"] and str(tmp_path) not in doc["command"]
