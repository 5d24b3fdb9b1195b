"""bench/hf_grid.py --tiny: the grid's output format on CPU (no timing asserts): a row per
family x regime x variant, the agreement columns against vanilla, the summary's verdicts,
and the metadata a result needs."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from _script_module import load_script

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def grid():
    return load_script("bench/hf_grid.py", "hf_grid_bench")


def test_tiny_grid_writes_every_cell_with_agreement_and_metadata(grid, tmp_path, monkeypatch):
    monkeypatch.delenv("GRETA_TRITON_ON_CPU", raising=False)  # the ops' torch references
    args = ["--tiny", "--out", str(tmp_path), "--families", "gemma",
            "--regimes", "train-b1s256,decode-b1,generate-static",
            "--variants", "greta,vanilla,compile,liger"]  # fmt: skip
    assert grid.main(args) == 0
    doc = json.loads((tmp_path / "hf_grid.json").read_text())
    rows = {(r["family"], r["regime"], r["variant"]): r for r in doc["rows"]}
    families, regimes = ("gemma",), ("train-b1s256", "decode-b1", "generate-static")
    variants = ("vanilla", "compile", "liger", "greta")
    assert set(rows) == {(f, r, v) for f in families for r in regimes for v in variants}
    # vanilla runs first whatever the order asked for: it is the agreement reference.
    assert [r["variant"] for r in doc["rows"][:3]] == ["vanilla"] * 3
    for f in families:
        for r in regimes:
            assert rows[(f, r, "liger")]["status"] == "skipped"  # CPU: Liger needs a GPU
        assert rows[(f, "decode-b1", "compile")]["status"] == "skipped"
        assert rows[(f, "train-b1s256", "compile")]["status"] == "ok"
        for v in ("vanilla", "greta"):
            for r in regimes:
                assert rows[(f, r, v)]["status"] == "ok", rows[(f, r, v)]
            train = rows[(f, "train-b1s256", v)]
            assert train["ms"] > 0 and math_finite(train["loss"])
            assert rows[(f, "decode-b1", v)]["tok_s"] > 0
        # Vanilla against itself: zero; GRETA (its torch references on CPU, float32): close.
        assert rows[(f, "train-b1s256", "vanilla")]["loss_rel_err"] == 0.0
        greta = rows[(f, "train-b1s256", "greta")]
        assert greta["loss_rel_err"] < 1e-5 and greta["logits_max_rel_err"] < 1e-5
        assert greta["grad_rel_err"] < 1e-4 and greta["grad_norm_max_rel_err"] < 1e-4
        assert json.loads(greta["implementations"])["linear_cross_entropy"] == "reference-torch"
    meta = doc["metadata"]
    assert meta["preset"] == "tiny" and meta["device"] == "cpu"
    assert meta["versions"]["torch"] and meta["versions"]["transformers"]
    assert meta["families"]["gemma"]["config"]["head_dim"] == 32
    assert set(meta["regimes"]) == set(regimes)
    assert doc["command"].startswith("python bench/hf_grid.py --tiny --out <out> --families")
    with (tmp_path / "hf_grid.csv").open() as fh:
        table = list(csv.DictReader(fh))
    assert len(table) == len(rows) and tuple(table[0]) == grid.FIELDS
    summary = {(s["family"], s["regime"]): s for s in doc["summary"]}
    assert set(summary) == {(f, r) for f in families for r in regimes}
    assert summary[("gemma", "train-b1s256")]["bound"] == "host"
    assert all(s["verdict"] in ("ahead", "behind-vanilla") for s in summary.values())
    assert (tmp_path / "hf_grid_summary.csv").is_file()
    png = tmp_path / "hf_grid.png"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert not png.exists()
    else:
        assert png.stat().st_size > 0


def test_append_replaces_only_the_cells_measured_again(grid, tmp_path, monkeypatch):
    monkeypatch.delenv("GRETA_TRITON_ON_CPU", raising=False)
    monkeypatch.setattr(grid, "plot", _no_matplotlib)
    base = ["--tiny", "--out", str(tmp_path), "--families", "qwen3", "--regimes", "train-b1s256"]
    assert grid.main([*base, "--variants", "vanilla"]) == 0
    assert grid.main([*base, "--variants", "greta", "--append"]) == 0
    doc = json.loads((tmp_path / "hf_grid.json").read_text())
    assert [(r["variant"], r["status"]) for r in doc["rows"]] == [
        ("vanilla", "ok"),
        ("greta", "ok"),
    ]
    # The second call found vanilla's probe from the first: agreement columns filled.
    assert doc["rows"][1]["loss_rel_err"] < 1e-5
    assert not (tmp_path / "hf_grid.png").exists()


def _no_matplotlib(*args: object) -> None:
    raise ImportError("No module named 'matplotlib'")


def math_finite(x: float) -> bool:
    return x == x and abs(x) != float("inf")


def _s(regime, greta, vanilla, peer=None, g_mem=None, l_mem=None, bound=True):
    return {"greta_vs_vanilla": vanilla / greta,
            **({"greta_vs_best_peer": peer / greta} if peer else {}),
            "greta_peak_gib": g_mem, "liger_peak_gib": l_mem}  # fmt: skip


@pytest.mark.parametrize(
    ("cell", "gpu_training", "want"),
    [
        (_s("t", 75.0, 104.5, 81.0, 7.26, 7.26), True, "ahead"),
        (_s("t", 75.0, 104.5, 70.0, 7.26, 7.26), True, "behind-peer"),
        (_s("t", 75.0, 104.5, 81.0, 8.0, 7.26), True, "over-memory"),
        (_s("t", 61.2, 29.6), False, "behind-vanilla"),  # issue 26's host-bound Qwen3 cell
        (_s("t", 30.0, 30.5), False, "ahead"),  # within TIME_TOL
        (_s("t", 75.0, 104.5), True, "incomplete"),  # no peer measured
    ],
)
def test_verdict(grid, cell, gpu_training, want):
    assert grid.verdict(cell, gpu_training) == want


def test_unknown_names_are_refused_in_one_line(grid, capsys):
    with pytest.raises(SystemExit):
        grid.main(["--tiny", "--out", "x", "--families", "llama,phi"])
    assert "unknown family: phi" in capsys.readouterr().err.strip().splitlines()[-1]


def test_every_family_has_liger_and_a_real_shape(grid):
    import transformers

    for fam in grid.FAMILIES.values():
        assert hasattr(transformers, fam.config_class) and hasattr(transformers, fam.model_class)
        assert fam.config["num_hidden_layers"] <= 8
        assert fam.liger.startswith("apply_liger_kernel_to_")


def test_main_signature_has_tiny_regimes_for_every_regime(grid):
    assert set(grid.TINY_REGIMES) == set(grid.REGIMES)
    for name, r in grid.REGIMES.items():
        assert grid.TINY_REGIMES[name].kind == r.kind


def test_probe_dir_is_scratch_inside_out(grid, tmp_path: Path, monkeypatch):
    monkeypatch.delenv("GRETA_TRITON_ON_CPU", raising=False)
    monkeypatch.setattr(grid, "plot", _no_matplotlib)
    args = ["--tiny", "--out", str(tmp_path), "--families", "mistral", "--regimes", "decode-b8",
            "--variants", "vanilla"]  # fmt: skip
    assert grid.main(args) == 0
    assert sorted(p.name for p in (tmp_path / ".probes").iterdir()) == ["mistral.pt"]


def test_a_process_per_variant_hands_its_rows_back(grid, tmp_path, monkeypatch):
    # The GPU path: the job goes to a child as JSON, its rows come back as ROW lines.
    monkeypatch.setenv("GRETA_TRITON_ON_CPU", "0")
    monkeypatch.setattr(grid, "plot", _no_matplotlib)
    args = ["--tiny", "--subprocess", "--out", str(tmp_path), "--families", "llama",
            "--regimes", "train-b1s256", "--variants", "vanilla,greta"]  # fmt: skip
    assert grid.main(args) == 0
    rows = json.loads((tmp_path / "hf_grid.json").read_text())["rows"]
    assert [(r["variant"], r["regime"], r["status"]) for r in rows] == [
        ("vanilla", "train-b1s256", "ok"), ("greta", "train-b1s256", "ok"),
    ]  # fmt: skip
    assert rows[1]["loss_rel_err"] < 1e-5  # the child found vanilla's probe


def test_a_child_that_dies_leaves_failed_rows_naming_why(grid, tmp_path):
    job = grid.Job(
        "llama", "vanilla", ["train-b1s256", "decode-b1"], "cpu", True, tmp_path, "eager"
    )
    # Not a family the worker knows: it fails before any row, and says so.
    job.family = "phi"
    rows = grid._in_subprocess(job, timeout=120)
    assert [r["status"] for r in rows] == ["failed", "failed"]
    assert "KeyError" in rows[0]["reason"]
