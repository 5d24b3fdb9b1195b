"""bench/hf_profile.py on CPU (no timing asserts): per variant the step's own-time table,
GRETA's ops in GRETA's table only (its patches are undone before the next variant runs)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from _script_module import load_script

pytest.importorskip("torch")
pytest.importorskip("transformers")


def test_each_variant_profiles_its_own_step(tmp_path: Path, monkeypatch) -> None:
    # The bench's driver is under test, not the kernels: GRETA's CPU ops take their torch
    # reference (the interpreter would run each Triton kernel for seconds).
    monkeypatch.setenv("GRETA_TRITON_ON_CPU", "0")
    prof = load_script("bench/hf_profile.py", "hf_profile_bench")
    assert prof.main(["--tiny", "--family", "llama", "--regime", "train-b1s256",
                      "--variants", "greta,vanilla", "--warmup", "0", "--steps", "1",
                      "--top", "200", "--out", str(tmp_path)]) == 0  # fmt: skip
    doc = json.loads((tmp_path / "hf_profile.json").read_text())
    assert (doc["family"], doc["regime"], doc["metadata"]["preset"]) == (
        "llama", "train-b1s256", "hf_profile",
    )  # fmt: skip
    greta, vanilla = doc["results"]
    names = {r["variant"]: [k["kernel"] for k in r["kernels"]] for r in doc["results"]}
    assert any("greta" in k for k in names["greta"])
    assert not any("greta" in k for k in names["vanilla"])  # the patches went with GRETA's run
    for r in (greta, vanilla):
        assert r["clock"] == "cpu" and r["device_ms_per_step"] > 0
        shares = [k["share"] for k in r["kernels"]]
        assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1 + 1e-9
    with (tmp_path / "hf_profile.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(greta["kernels"]) + len(vanilla["kernels"])


def test_unknown_variants_are_refused(tmp_path: Path) -> None:
    prof = load_script("bench/hf_profile.py", "hf_profile_bench")
    with pytest.raises(SystemExit):
        prof.main(["--tiny", "--variants", "greta,tvm", "--out", str(tmp_path)])
    assert not (tmp_path / "hf_profile.json").exists()
