"""bench/hf_llama.py --tiny: the side-by-side benchmark runs on CPU and writes its files."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from _script_module import load_script

pytest.importorskip("torch")
pytest.importorskip("transformers")

BENCH = Path(__file__).resolve().parents[1] / "bench" / "hf_llama.py"


def _load():
    return load_script("bench/hf_llama.py", "hf_llama_bench")


def test_tiny_run_writes_rows_for_every_variant(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("GRETA_TRITON_ON_CPU", raising=False)  # the ops' torch references
    bench = _load()
    assert bench.main(["--tiny", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "hf_llama.json").read_text())
    rows = {r["variant"]: r for r in doc["rows"]}
    assert set(rows) == {"vanilla", "liger", "greta", "greta-attn", "greta-sdpa"}
    assert doc["metadata"]["preset"] == "tiny" and doc["metadata"]["device"] == "cpu"
    for variant in ("vanilla", "greta", "greta-attn", "greta-sdpa"):
        row = rows[variant]
        assert row["status"] == "ok", row
        assert row["train_step_ms"] > 0 and row["decode_tok_s"] > 0
    # Same weights, same probe batch: GRETA's logits match vanilla's (fp32 on CPU).
    assert rows["greta"]["logits_max_rel_err"] < 1e-5
    assert abs(rows["greta"]["loss"] - rows["vanilla"]["loss"]) < 1e-5
    seen = json.loads(rows["greta"]["implementations"])
    assert seen["linear_cross_entropy"] == "reference-torch"
    assert "attention" not in json.loads(rows["greta-sdpa"]["implementations"])
    assert json.loads(rows["greta-attn"]["implementations"])["attention"] == "reference-torch"
    assert rows["liger"]["status"] == "skipped"  # CPU: Liger's kernels need a GPU
    with (tmp_path / "hf_llama.csv").open() as fh:
        assert len(list(csv.DictReader(fh))) == 5
    assert (tmp_path / "hf_llama.png").stat().st_size > 0
    assert not list(tmp_path.glob(".probe_*"))


def test_tiny_run_defaults_to_the_cache_and_names_only_files_it_wrote(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.delenv("GRETA_TRITON_ON_CPU", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    bench = _load()
    monkeypatch.setattr(bench, "plot", _no_matplotlib)
    checkout = BENCH.parent / "results" / "cpu"
    before = sorted(checkout.rglob("*")) if checkout.exists() else None
    assert bench.main(["--tiny", "--variants", "vanilla"]) == 0
    (out,) = (tmp_path / "greta" / "hf_llama").iterdir()
    assert (out / "hf_llama.json").is_file() and not (out / "hf_llama.png").exists()
    wrote = [line for line in capsys.readouterr().out.splitlines() if line.startswith("wrote ")]
    assert wrote == [f"wrote {out / 'hf_llama.json'}, {out / 'hf_llama.csv'}"]
    after = sorted(checkout.rglob("*")) if checkout.exists() else None
    assert after == before  # nothing written into the checkout


def _no_matplotlib(*args: object) -> None:
    raise ImportError("No module named 'matplotlib'")
