"""bench/hf_host_ab.py on CPU (no timing asserts): one model, GRETA patched in and reverted
round by round in alternating order, the ratio the median of the rounds' ratios, and the
model left as transformers made it (conftest's fixture fails a test that leaves a patch)."""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

import pytest
from _script_module import load_script

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def ab():
    return load_script("bench/hf_host_ab.py", "hf_host_ab_bench")


def test_rounds_alternate_the_patch_on_one_model(ab, tmp_path: Path, monkeypatch) -> None:
    import greta_core.transformers as gt

    calls: list[str] = []
    apply, revert = gt.apply_greta, gt.revert_greta

    def spy_apply(target, **kw):
        calls.append("apply")
        return apply(target, **kw)

    def spy_revert(target):
        calls.append(f"revert {target}" if isinstance(target, str) else "revert model")
        return revert(target)

    # The bench's driver is under test, not the kernels: GRETA's CPU ops take their torch
    # reference (the interpreter would run each Triton kernel for seconds).
    monkeypatch.setenv("GRETA_TRITON_ON_CPU", "0")
    monkeypatch.setattr(gt, "apply_greta", spy_apply)
    monkeypatch.setattr(gt, "revert_greta", spy_revert)
    assert ab.main(["--tiny", "--families", "llama", "--regimes", "train-b1s256,decode-b1",
                    "--rounds", "3", "--steps", "1", "--warmup", "0",
                    "--out", str(tmp_path)]) == 0  # fmt: skip
    # Round 0 vanilla first, round 1 GRETA first, round 2 vanilla first: one patch per round
    # and regime, each undone for the model and the family's RoPE.
    assert calls == ["apply", "revert model", "revert llama"] * 6
    doc = json.loads((tmp_path / "hf_host_ab.json").read_text())
    row, decode = doc["rows"]
    assert (row["regime"], decode["regime"]) == ("train-b1s256", "decode-b1")
    # Greedy decode of the tiny float32 model: GRETA's reference paths give vanilla's tokens.
    assert decode["tokens_equal"] == decode["batch"] * decode["new_tokens"]
    assert decode["greta_tok_s"] == pytest.approx(
        decode["batch"] * decode["new_tokens"] / (decode["greta_ms"] / 1e3)
    )
    assert doc["metadata"]["preset"] == "hf_host_ab" and row["rounds"] == 3
    assert len(row["per_round"]) == 3
    ratios = [r["vanilla_ms"] / r["greta_ms"] for r in row["per_round"]]
    assert row["greta_vs_vanilla"] == pytest.approx(statistics.median(ratios))
    assert row["ratio_min"] == min(ratios) and row["ratio_max"] == max(ratios)
    # float32 on the CPU: GRETA's reference paths compute vanilla's loss to rounding.
    assert row["loss_rel_err"] < 1e-5
    with (tmp_path / "hf_host_ab.csv").open() as fh:
        lines = list(csv.DictReader(fh))
    assert [(x["family"], x["regime"]) for x in lines] == [
        ("llama", "train-b1s256"), ("llama", "decode-b1"),
    ]  # fmt: skip


def test_bad_arguments_are_refused_before_any_model_is_built(ab, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        ab.main(["--tiny", "--families", "llama,falcon", "--out", str(tmp_path)])
    assert exc.value.code == 2
    with pytest.raises(SystemExit):
        ab.main(["--tiny", "--rounds", "0", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):  # a GPU-bound regime is hf_grid.py's
        ab.main(["--tiny", "--regimes", "train-b4s2048", "--out", str(tmp_path)])
    assert not (tmp_path / "hf_host_ab.json").exists()


def test_append_keeps_the_earlier_cells_of_the_same_stack(ab, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("GRETA_TRITON_ON_CPU", "0")
    base = ["--tiny", "--rounds", "1", "--steps", "1", "--warmup", "0", "--out", str(tmp_path)]
    assert ab.main([*base, "--families", "llama", "--regimes", "train-b1s256"]) == 0
    assert ab.main([*base, "--families", "qwen3", "--regimes", "train-b1s256", "--append"]) == 0
    doc = json.loads((tmp_path / "hf_host_ab.json").read_text())
    assert [r["family"] for r in doc["rows"]] == ["llama", "qwen3"]
    assert len(doc["metadata"]["merged"]) == 2
    # Without --append a run's file holds its own cells only.
    assert ab.main([*base, "--families", "qwen3", "--regimes", "train-b1s256"]) == 0
    assert [
        r["family"] for r in json.loads((tmp_path / "hf_host_ab.json").read_text())["rows"]
    ] == ["qwen3"]


def test_append_refuses_another_stack_before_running(ab, tmp_path: Path, capsys) -> None:
    old = {"metadata": {"gpu_name": "NVIDIA H200", "versions": {"torch": "2.15.0", "triton": "3.9.0"}},
           "command": "python bench/hf_host_ab.py --out <out>", "rows": []}  # fmt: skip
    (tmp_path / "hf_host_ab.json").write_text(json.dumps(old))
    with pytest.raises(SystemExit):
        ab.main(["--tiny", "--families", "llama", "--out", str(tmp_path), "--append"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert (
        "--append: refusing to merge runs on different stacks: gpu_name NVIDIA H200 vs None" in err
    )
    assert json.loads((tmp_path / "hf_host_ab.json").read_text()) == old
