"""bench/hf_grid.py on CPU (no timing asserts). The driver (cell planning, vanilla first,
--append, the result files, the summary's verdicts) runs against a stubbed runner; one real
tiny in-process run checks the measured rows and the agreement with vanilla; one child
process checks the process-per-variant path end to end; a dying or hanging child is
simulated."""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from _script_module import load_script

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def grid():
    return load_script("bench/hf_grid.py", "hf_grid_bench")


def _no_matplotlib(*args: object) -> None:
    raise ImportError("No module named 'matplotlib'")


def math_finite(x: float) -> bool:
    return x == x and abs(x) != float("inf")


# --- the driver, with a stubbed runner ------------------------------------------------------

# Stub speeds per variant (ms of a train step; decode tokens/s is 100 / ms) and peaks.
STUB_MS = {"vanilla": 10.0, "compile": 9.0, "liger": 8.5, "greta": 8.0}
STUB_PEAK = {"vanilla": 1.2, "compile": 1.1, "liger": 0.9, "greta": 1.0}


@pytest.fixture
def stub(grid, monkeypatch):
    """Replaces run_job (what the worker runs per (family, variant)); records each job."""
    jobs: list[Any] = []

    def run_job(job: Any) -> list[dict[str, Any]]:
        jobs.append(job)
        rows = []
        for name in job.regimes:
            r = grid.TINY_REGIMES[name]
            row = {"family": job.family, "variant": job.variant, "regime": name,
                   "batch": r.batch, "seq": r.seq, "status": "ok",
                   "peak_gib": STUB_PEAK[job.variant], "stub_call": len(jobs)}  # fmt: skip
            if r.kind == "train":
                row.update(ms=STUB_MS[job.variant], loss=5.0)
            else:
                row["tok_s"] = 100.0 / STUB_MS[job.variant]
            rows.append(row)
        return rows

    monkeypatch.setattr(grid, "run_job", run_job)
    monkeypatch.setattr(grid, "plot", _no_matplotlib)
    return jobs


def test_driver_runs_every_cell_vanilla_first_and_writes_the_results(grid, stub, tmp_path):
    regimes = ("train-b1s256", "train-b4s2048", "decode-b1")
    args = ["--tiny", "--out", str(tmp_path), "--families", "gemma,qwen3",
            "--regimes", ",".join(regimes), "--variants", "greta,liger,vanilla,compile"]  # fmt: skip
    assert grid.main(args) == 0
    # One job per (family, variant), families in the order asked, vanilla (the agreement
    # reference) first in each whatever the order asked for; every job runs every regime.
    assert [(j.family, j.variant) for j in stub] == [
        (f, v) for f in ("gemma", "qwen3") for v in ("vanilla", "greta", "liger", "compile")
    ]
    assert all(j.regimes == list(regimes) for j in stub)
    assert {(j.device, j.tiny, j.compile_backend, j.probe_dir) for j in stub} == {
        ("cpu", True, "eager", tmp_path / ".probes")
    }
    doc = json.loads((tmp_path / "hf_grid.json").read_text())
    assert len(doc["rows"]) == 2 * 4 * len(regimes)
    with (tmp_path / "hf_grid.csv").open() as fh:
        table = list(csv.DictReader(fh))
    assert len(table) == len(doc["rows"]) and tuple(table[0]) == grid.FIELDS
    assert "stub_call" not in table[0]  # only the declared columns
    summary = {(s["family"], s["regime"]): s for s in doc["summary"]}
    assert set(summary) == {(f, r) for f in ("gemma", "qwen3") for r in regimes}
    host = summary[("gemma", "train-b1s256")]
    assert (host["bound"], host["metric"], host["best_peer"]) == ("host", "ms", "liger")
    assert host["greta_vs_vanilla"] == pytest.approx(10.0 / 8.0)
    assert host["greta_vs_best_peer"] == pytest.approx(8.5 / 8.0)
    assert host["verdict"] == "ahead"
    # GPU-bound training also weighs memory against Liger's: 1.0 GiB over 0.9.
    gpu = summary[("gemma", "train-b4s2048")]
    assert (gpu["bound"], gpu["greta_peak_gib"], gpu["liger_peak_gib"]) == ("gpu", 1.0, 0.9)
    assert gpu["verdict"] == "over-memory"
    decode = summary[("qwen3", "decode-b1")]
    assert decode["metric"] == "tok_s" and decode["greta_vs_vanilla"] == pytest.approx(1.25)
    with (tmp_path / "hf_grid_summary.csv").open() as fh:
        assert tuple(next(csv.DictReader(fh))) == grid.SUMMARY_FIELDS
    meta = doc["metadata"]
    assert meta["preset"] == "tiny" and meta["device"] == "cpu"
    assert meta["versions"]["torch"] and meta["versions"]["transformers"]
    assert meta["families"]["gemma"]["config"]["head_dim"] == 32
    assert meta["families"]["qwen3"]["shaped_like"].startswith("Qwen3-1.7B")
    assert meta["regimes"]["train-b1s256"]["seq"] == 16  # the tiny table's
    assert set(meta["regimes"]) == set(regimes)
    assert (meta["time_tol"], meta["mem_tol"]) == (grid.TIME_TOL, grid.MEM_TOL)
    assert doc["command"].startswith("python bench/hf_grid.py --tiny --out <out> --families")
    assert doc["not_run_budget"] == []
    assert not (tmp_path / "hf_grid.png").exists()  # plot failed: the numbers stand alone


def test_interleaved_host_cells_decide_the_verdict_against_vanilla(grid, stub, tmp_path):
    # bench/hf_host_ab.py's result in the same folder: its ratio (one process, alternating
    # rounds) stands beside the two processes' and decides a host-bound cell; a GPU-bound
    # cell keeps its own. Rows of the training-only version carry no regime.
    (tmp_path / grid.INTERLEAVED).write_text(json.dumps({"rows": [
        {"family": "llama", "greta_vs_vanilla": 0.9},
        {"family": "llama", "regime": "decode-b1", "greta_vs_vanilla": 1.3},
        {"family": "llama", "regime": "train-b4s2048", "greta_vs_vanilla": 0.5},
    ]}))  # fmt: skip
    args = ["--tiny", "--out", str(tmp_path), "--families", "llama", "--regimes",
            "train-b1s256,train-b4s2048,decode-b1", "--variants", "vanilla,greta"]  # fmt: skip
    assert grid.main(args) == 0
    doc = json.loads((tmp_path / "hf_grid.json").read_text())
    summary = {s["regime"]: s for s in doc["summary"]}
    host = summary["train-b1s256"]
    assert host["greta_vs_vanilla"] == pytest.approx(10.0 / 8.0)  # the stub's processes
    assert host["greta_vs_vanilla_interleaved"] == 0.9
    assert host["verdict"] == "behind-vanilla"
    assert summary["decode-b1"]["greta_vs_vanilla_interleaved"] == 1.3
    assert summary["decode-b1"]["verdict"] == "ahead"
    assert "greta_vs_vanilla_interleaved" not in summary["train-b4s2048"]
    assert grid.interleaved(tmp_path / "none.json") == {}
    # A later interleaved run in the folder recomputes the grid's summary, rows untouched.
    (tmp_path / grid.INTERLEAVED).write_text(json.dumps({"rows": [
        {"family": "llama", "regime": "train-b1s256", "greta_vs_vanilla": 1.1},
    ]}))  # fmt: skip
    assert grid.resummarize(tmp_path) and not grid.resummarize(tmp_path / "empty")
    again = json.loads((tmp_path / "hf_grid.json").read_text())
    assert again["rows"] == doc["rows"]
    host = next(s for s in again["summary"] if s["regime"] == "train-b1s256")
    assert (host["greta_vs_vanilla_interleaved"], host["verdict"]) == (1.1, "ahead")
    with (tmp_path / "hf_grid_summary.csv").open() as fh:
        assert {r["regime"]: r["verdict"] for r in csv.DictReader(fh)}["decode-b1"] == "ahead"


def test_config_reaches_every_job_and_the_metadata(grid, stub, tmp_path, capsys):
    table = {"linear_cross_entropy": {"CHUNK_SCALE": 8}}
    args = ["--tiny", "--out", str(tmp_path), "--families", "llama", "--regimes", "decode-b1",
            "--variants", "vanilla,greta", "--config", json.dumps(table)]  # fmt: skip
    assert grid.main(args) == 0
    assert [j.extra for j in stub] == [{"config": table}] * 2
    assert json.loads((tmp_path / "hf_grid.json").read_text())["metadata"]["config"] == table
    with pytest.raises(SystemExit):
        grid.main([*args[:-1], '{"linear_cross_entropy": 8}'])
    assert "--config must map op names" in capsys.readouterr().err


def test_a_job_runs_under_its_config(grid, monkeypatch):
    from greta_core import configs

    seen = []
    monkeypatch.setattr(grid, "_run_job", lambda job: seen.append(
        configs.lookup("linear_cross_entropy", "default", {}).get("CHUNK_SCALE")) or [])  # fmt: skip
    job = grid.Job("llama", "greta", ["decode-b1"], "cpu", True, Path("."), "eager",
                   {"config": {"linear_cross_entropy": {"CHUNK_SCALE": 8}}})  # fmt: skip
    assert grid.run_job(job) == []
    assert seen == [8]
    job.extra = {}
    grid.run_job(job)
    assert seen[-1] != 8  # the shipped table again


def test_append_replaces_only_the_cells_measured_again(grid, stub, tmp_path):
    base = ["--tiny", "--out", str(tmp_path), "--families", "llama"]
    assert grid.main([*base, "--regimes", "train-b1s256,decode-b1",
                      "--variants", "vanilla,greta"]) == 0  # fmt: skip
    assert grid.main([*base, "--regimes", "decode-b1", "--variants", "greta", "--append"]) == 0
    doc = json.loads((tmp_path / "hf_grid.json").read_text())
    cells = [(r["regime"], r["variant"], r["stub_call"]) for r in doc["rows"]]
    assert cells == [("train-b1s256", "vanilla", 1), ("decode-b1", "vanilla", 1),
                     ("train-b1s256", "greta", 2), ("decode-b1", "greta", 3)]  # fmt: skip
    # Without --append the folder's earlier rows go.
    assert grid.main([*base, "--regimes", "decode-b1", "--variants", "greta"]) == 0
    doc = json.loads((tmp_path / "hf_grid.json").read_text())
    assert [(r["regime"], r["variant"]) for r in doc["rows"]] == [("decode-b1", "greta")]


def test_past_the_budget_no_process_starts_and_the_cells_are_named(grid, stub, tmp_path):
    args = ["--tiny", "--out", str(tmp_path), "--families", "llama,mistral",
            "--regimes", "decode-b1", "--variants", "vanilla,greta", "--budget-s", "-1"]  # fmt: skip
    assert grid.main(args) == 0
    assert stub == []
    doc = json.loads((tmp_path / "hf_grid.json").read_text())
    assert doc["rows"] == [] and doc["summary"] == []
    assert doc["not_run_budget"] == ["llama/vanilla", "llama/greta", "mistral/vanilla",
                                     "mistral/greta"]  # fmt: skip


def test_what_cannot_run_here_is_skipped_with_the_reason(grid):
    assert "need a GPU" in grid.job_skip_reason("liger", "cpu")
    assert grid.job_skip_reason("greta", "cpu") == grid.job_skip_reason("compile", "cpu") == ""
    decode, static = grid.REGIMES["decode-b1"], grid.REGIMES["generate-static"]
    assert "generate-static" in grid.skip_reason("compile", decode)
    assert grid.skip_reason("compile", static) == grid.skip_reason("greta", decode) == ""


def test_agreement_is_relative_error_against_vanilla(grid):
    import torch

    ref = {"logits": torch.tensor([[1.0, -2.0], [4.0, 0.5]]), "loss": 2.0,
           "norms": {"a": 2.0, "b": 4.0, "zero": 0.0}, "q_grad": torch.tensor([3.0, 4.0])}  # fmt: skip
    probe = {"logits": torch.tensor([[1.0, -2.0], [4.2, 0.5]]), "loss": 2.1,
             "norms": {"a": 2.2, "b": 4.0, "zero": 1.0}, "q_grad": torch.tensor([3.0, 4.5])}  # fmt: skip
    got = grid.agreement(probe, ref)
    assert got["logits_max_rel_err"] == pytest.approx(0.2 / 4.0)
    assert got["logits_rel_l2_err"] == pytest.approx(0.2 / ref["logits"].norm().item())
    assert got["loss_rel_err"] == pytest.approx(0.05)
    assert got["grad_rel_err"] == pytest.approx(0.5 / 5.0)
    assert got["grad_norm_max_rel_err"] == pytest.approx(0.1)  # "zero" has no relative error
    assert set(grid.agreement(ref, ref).values()) == {0.0}
    assert "grad_rel_err" not in grid.agreement({**probe, "q_grad": None}, ref)


# --- real runs --------------------------------------------------------------------------------


def test_tiny_run_measures_every_cell_and_agrees_with_vanilla(grid, tmp_path, monkeypatch):
    monkeypatch.delenv("GRETA_TRITON_ON_CPU", raising=False)  # the ops' torch references
    monkeypatch.setattr(grid, "plot", _no_matplotlib)
    regimes = ("train-b1s256", "decode-b1", "generate-static")
    args = ["--tiny", "--out", str(tmp_path), "--families", "gemma",
            "--regimes", ",".join(regimes), "--variants", "greta,vanilla,compile,liger"]  # fmt: skip
    assert grid.main(args) == 0
    doc = json.loads((tmp_path / "hf_grid.json").read_text())
    rows = {(r["regime"], r["variant"]): r for r in doc["rows"]}
    for r in regimes:
        assert rows[(r, "liger")]["status"] == "skipped"  # CPU: Liger needs a GPU
    assert rows[("decode-b1", "compile")]["status"] == "skipped"
    assert rows[("train-b1s256", "compile")]["status"] == "ok"
    for v in ("vanilla", "greta"):
        for r in regimes:
            assert rows[(r, v)]["status"] == "ok", rows[(r, v)]
        train = rows[("train-b1s256", v)]
        assert train["ms"] > 0 and math_finite(train["loss"])
        assert rows[("decode-b1", v)]["tok_s"] > 0
    # Vanilla against itself: zero; GRETA (its torch references on CPU, float32): close.
    assert rows[("train-b1s256", "vanilla")]["loss_rel_err"] == 0.0
    greta = rows[("train-b1s256", "greta")]
    assert greta["loss_rel_err"] < 1e-5 and greta["logits_max_rel_err"] < 1e-5
    assert greta["grad_rel_err"] < 1e-4 and greta["grad_norm_max_rel_err"] < 1e-4
    assert json.loads(greta["implementations"])["linear_cross_entropy"] == "reference-torch"
    assert json.loads(rows[("train-b1s256", "vanilla")]["implementations"]) == {}
    # Vanilla's probe is scratch inside --out, for later calls' agreement columns.
    assert sorted(p.name for p in (tmp_path / ".probes").iterdir()) == ["gemma.pt"]


def test_a_process_per_variant_hands_its_rows_back(grid, tmp_path, monkeypatch):
    # The GPU path: the job goes to a child as JSON, its rows come back as ROW lines. The
    # child (vanilla) leaves its probe; GRETA, in this process, then measures against it.
    monkeypatch.setenv("GRETA_TRITON_ON_CPU", "0")
    monkeypatch.setattr(grid, "plot", _no_matplotlib)
    base = ["--tiny", "--out", str(tmp_path), "--families", "llama", "--regimes", "train-b1s256"]
    assert grid.main([*base, "--subprocess", "--variants", "vanilla"]) == 0
    assert grid.main([*base, "--variants", "greta", "--append"]) == 0
    rows = json.loads((tmp_path / "hf_grid.json").read_text())["rows"]
    assert [(r["variant"], r["regime"], r["status"]) for r in rows] == [
        ("vanilla", "train-b1s256", "ok"), ("greta", "train-b1s256", "ok"),
    ]  # fmt: skip
    assert rows[0]["ms"] > 0 and rows[0]["loss_rel_err"] == 0.0
    assert rows[1]["loss_rel_err"] < 1e-5  # the child's probe, found


# --- a child that dies or hangs (simulated) ---------------------------------------------------


def _job(grid, tmp_path: Path, family: str = "llama") -> Any:
    return grid.Job(family, "vanilla", ["train-b1s256", "decode-b1"], "cpu", True, tmp_path,
                    "eager")  # fmt: skip


def test_a_worker_that_fails_says_why_on_every_row(grid, tmp_path, capsys):
    # What the child runs: an unknown family fails before any row, and says so per regime.
    job = _job(grid, tmp_path, family="phi")
    payload = json.dumps({**grid.asdict(job), "probe_dir": str(tmp_path)})
    assert grid.main(["--worker", payload]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [json.loads(x[4:]) for x in lines if x.startswith("ROW ")]
    assert [(r["regime"], r["status"]) for r in rows] == [
        ("train-b1s256", "failed"), ("decode-b1", "failed"),
    ]  # fmt: skip
    assert all(r["reason"].startswith("KeyError") for r in rows)


def test_a_child_that_dies_leaves_failed_rows_naming_why(grid, tmp_path, monkeypatch):
    done = {"family": "llama", "variant": "vanilla", "regime": "train-b1s256", "status": "ok"}
    calls: list[list[str]] = []

    def died(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        return subprocess.CompletedProcess(
            cmd, -9, stdout="loading\nROW " + json.dumps(done) + "\n",
            stderr="Traceback (most recent call last):\nFile a\nFile b\nMemoryError: host\n",
        )  # fmt: skip

    monkeypatch.setattr(grid.subprocess, "run", died)
    rows = grid._in_subprocess(_job(grid, tmp_path), timeout=120)
    assert rows[0] == done  # what it printed before dying is kept
    assert (rows[1]["regime"], rows[1]["status"]) == ("decode-b1", "failed")
    assert rows[1]["reason"] == "exit -9: File a | File b | MemoryError: host"  # stderr's tail
    # The child got the whole job as JSON after --worker.
    payload = json.loads(calls[0][calls[0].index("--worker") + 1])
    assert payload["regimes"] == ["train-b1s256", "decode-b1"]
    assert payload["probe_dir"] == str(tmp_path)


def test_a_child_that_hangs_leaves_failed_rows_naming_the_timeout(grid, tmp_path, monkeypatch):
    done = {"family": "llama", "variant": "vanilla", "regime": "train-b1s256", "status": "ok"}

    def hung(cmd: list[str], **kw: Any) -> None:
        raise subprocess.TimeoutExpired(
            cmd, kw["timeout"], output=b"ROW " + json.dumps(done).encode()
        )

    monkeypatch.setattr(grid.subprocess, "run", hung)
    rows = grid._in_subprocess(_job(grid, tmp_path), timeout=120)
    assert rows == [done, {"family": "llama", "variant": "vanilla", "regime": "decode-b1",
                           "status": "failed", "reason": "timed out after 120 s"}]  # fmt: skip


# --- tables and the CLI -------------------------------------------------------------------------


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


def test_merge_takes_a_rerun_variant_into_the_grid_and_resummarizes(grid, tmp_path) -> None:
    def row(variant, ms, peak, status="ok"):
        return {"family": "qwen3", "regime": "train-b4s2048", "variant": variant,
                "status": status, "ms": ms, "peak_gib": peak}  # fmt: skip

    meta = {"gpu_name": "NVIDIA H200", "versions": {"torch": "2.15.0", "triton": "3.9.0"}}
    first = {"metadata": meta, "command": "python bench/hf_grid.py --out <out>", "rows": [
        row("vanilla", 103.7, 24.6), row("liger", None, None, "skipped"),
        row("greta", 74.4, 6.54), row("compile", 74.6, 13.5)]}  # fmt: skip
    rerun = {"metadata": meta, "command": "python bench/hf_grid.py --variants liger", "rows": [
        row("liger", 102.4, 6.48)]}  # fmt: skip
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, doc in zip(paths, (first, rerun), strict=True):
        path.write_text(json.dumps(doc))
    out = tmp_path / "grid"
    assert grid.main(["--out", str(out), "--merge", *map(str, paths)]) == 0
    doc = json.loads((out / "hf_grid.json").read_text())
    assert [(r["variant"], r["status"]) for r in doc["rows"]] == [
        ("vanilla", "ok"), ("liger", "ok"), ("greta", "ok"), ("compile", "ok")]  # fmt: skip
    (s,) = doc["summary"]
    # GRETA 74.4 ms against compile's 74.6 (the best peer) at 6.54 GiB: within 2% of Liger's.
    assert s["best_peer"] == "compile" and s["liger_peak_gib"] == 6.48
    assert s["verdict"] == "ahead"
    assert doc["metadata"]["merged"][1]["command"] == rerun["command"]
    # Without the rerun the cell has no Liger peak to hold GRETA to.
    assert grid.main(["--out", str(tmp_path / "g1"), "--merge", str(paths[0])]) == 0
    (s1,) = json.loads((tmp_path / "g1" / "hf_grid.json").read_text())["summary"]
    assert "liger_peak_gib" not in s1
