"""bench/lce_grid.py without a GPU: its float32 reference, one cell's rows on CPU (no timing
asserts), the per-cell verdict and the threshold it suggests for the dispatch table."""

from __future__ import annotations

import csv
import json

import pytest
from _script_module import load_script

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from greta_core.arch import interpreter_active  # noqa: E402

# The grid's CPU cells run GRETA's kernel through Triton's interpreter beside torch core's
# F.linear_cross_entropy (torch >= 2.13); a GPU machine's suite (no interpreter, maybe an
# older torch) measures the real cells with the GPU commands instead.
cpu_cells = pytest.mark.skipif(
    not interpreter_active() or not hasattr(torch.nn.functional, "linear_cross_entropy"),
    reason="CPU cells need the Triton interpreter and torch >= 2.13",
)


@pytest.fixture(scope="module")
def grid():
    return load_script("bench/lce_grid.py", "lce_grid_bench")


def test_reference_matches_float64_autograd(grid) -> None:
    hidden, weight, target = grid._inputs(20, 16, 50, device="cpu")
    loss, dh, dw = grid.reference(hidden, weight, target, rows=7)  # 3 chunks, one short
    h = hidden.double().requires_grad_()
    w = weight.double().requires_grad_()
    want = torch.nn.functional.cross_entropy(h @ w.t(), target, ignore_index=grid.IGNORE)
    want_dh, want_dw = torch.autograd.grad(want, (h, w))
    # float32 maths over 50 classes and 20 rows: float32 rounding, far below 1e-5 relative.
    assert loss == pytest.approx(want.item(), rel=1e-5)
    torch.testing.assert_close(dh.double(), want_dh, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(dw.double(), want_dw, rtol=1e-5, atol=1e-7)


@cpu_cells
def test_one_cell_on_cpu_gives_a_row_per_variant(grid) -> None:
    variants = ["core", "core-lean", "naive", "greta", "greta-kernel", "greta-kernel-nofloor"]
    rows = grid.run_cell(24, 16, 40, variants, device="cpu")
    assert [r["variant"] for r in rows] == variants
    by = {r["variant"]: r for r in rows}
    assert all(r["status"] == "ok" for r in rows), rows
    # bf16 inputs, float32 reference: every implementation within bf16 rounding (2^-8) of it.
    for r in rows:
        assert r["loss_rel_err"] < 2**-7 and r["dh_rel_err"] < 2**-5 and r["dw_rel_err"] < 2**-5
    # The CPU's table dispatches nothing: GRETA ran its kernel (through the interpreter).
    assert by["greta"]["impl"] == "triton-interpret"
    assert by["greta-kernel"]["impl"] == "triton-interpret"
    assert by["core"]["impl"] == "core"


@cpu_cells
def test_rounds_interleave_the_variants_and_report_the_median(grid, monkeypatch) -> None:
    calls = []

    def fake_ms(fn):  # the k-th timing call reports k: the order is in the rows
        fn()
        calls.append(fn)
        return float(len(calls))

    monkeypatch.setattr(grid, "_median_ms", fake_ms)
    variants = ["naive", "greta", "greta-kernel-liger-chunk"]
    rows = grid.run_cell(24, 16, 40, variants, device="cpu", rounds=3)
    # Round 0 starts at the first variant, round 1 at the second, round 2 at the third.
    assert [r["ms_rounds"] for r in rows] == [[1.0, 6.0, 8.0], [2.0, 4.0, 9.0], [3.0, 5.0, 7.0]]
    assert [r["ms"] for r in rows] == [6.0, 4.0, 5.0]
    assert all(r["status"] == "ok" for r in rows)


def test_rounds_below_one_are_refused_in_one_line(grid, capsys) -> None:
    with pytest.raises(SystemExit):
        grid.main(["--out", "unused", "--rounds", "0"])
    assert "--rounds 0: expected at least 1" in capsys.readouterr().err


@pytest.mark.parametrize(("n", "h", "v"), [(8192, 2048, 128256), (8192, 2048, 262144),
                                           (32768, 4096, 32000), (100, 64, 50)])  # fmt: skip
def test_liger_chunk_variant_chunks_as_liger_does(grid, n, h, v) -> None:
    from greta_core import configs
    from greta_core.ops import linear_cross_entropy as lce

    change = {"linear_cross_entropy": grid.FORCED["greta-kernel-liger-chunk"]}
    with configs.Override(change):
        rows = lce.chunk_rows(n, v, h, *lce.chunk_schedule("sm_90", n, v, h))
    # Liger-Kernel 0.8.5's fused_linear_cross_entropy_forward: next_power_of_2(cdiv(BT,
    # cdiv(V, H))) tokens per chunk.
    liger = 1 << (-(-n // -(-v // h)) - 1).bit_length()
    assert rows == liger
    # The table itself chunks more rows than Liger at these 8192-token shapes (its floor).
    if n == 8192:
        table = lce.chunk_rows(n, v, h, *lce.chunk_schedule("sm_90", n, v, h))
        assert table > liger


def test_summary_reports_the_kernel_at_liger_s_chunk(grid) -> None:
    rows = [_row(8192, "core", 20.0, 5.9), _row(8192, "liger", 30.0, 0.6),
            _row(8192, "greta", 22.0, 0.7, "triton"),
            _row(8192, "greta-kernel-liger-chunk", 25.0, 0.6, "triton")]  # fmt: skip
    (s,) = grid.summarize(rows)
    assert s["liger_chunk_vs_core"] == pytest.approx(25.0 / 20.0)
    assert s["liger_chunk_vs_liger_mem"] == pytest.approx(1.0)
    assert s["verdict"] == "slower+over-memory"  # the verdict reads "greta" alone
    (s,) = grid.summarize(rows[:3])
    assert "liger_chunk_vs_core" not in s


def _row(n, variant, ms, gib, impl=None, h=4096, v=128256):
    return {"tokens": n, "hidden": h, "vocab": v, "variant": variant, "status": "ok",
            "ms": ms, "extra_gib": gib, "impl": impl or variant}  # fmt: skip


def test_verdicts_follow_issue_26s_criterion(grid) -> None:
    rows = [
        # 512 tokens: the table delegated (memory within 12% of Liger's); 1024: delegated
        # at 20% more memory than Liger.
        _row(512, "greta", 3.0, 1.1, "torch-linear-ce"), _row(512, "core", 3.0, 1.1),
        _row(512, "liger", 9.0, 1.0),
        _row(1024, "greta", 5.0, 1.2, "torch-linear-ce"), _row(1024, "liger", 19.0, 1.0),
        # 2048: GRETA's kernel, slower than core, at Liger's memory.
        _row(2048, "greta", 15.0, 1.05, "triton"), _row(2048, "core", 10.4, 1.48),
        _row(2048, "core-lean", 30.0, 2.0), _row(2048, "liger", 60.6, 1.01),
        # 8192: ahead of the fastest core variant (within 3%), memory within 12% of Liger's.
        _row(8192, "greta", 23.0, 0.64, "triton"), _row(8192, "core", 22.8, 5.87),
        _row(8192, "liger", 34.7, 0.58),
        # 16384: fast but 20% over Liger's memory.
        _row(16384, "greta", 90.0, 1.72, "triton"), _row(16384, "core", 99.5, 13.9),
        _row(16384, "liger", 108.3, 1.43),
    ]  # fmt: skip
    verdicts = {s["tokens"]: s["verdict"] for s in grid.summarize(rows)}
    assert verdicts == {
        512: "delegates", 1024: "delegates-over-memory", 2048: "slower", 8192: "ahead",
        16384: "over-memory",
    }  # fmt: skip
    best = {s["tokens"]: s.get("best_core") for s in grid.summarize(rows)}
    assert best[2048] == "core"


def test_suggested_threshold_is_the_last_n_per_h_where_core_won_everywhere_up_to_1(grid) -> None:
    def cell(n, core_ms, kernel_ms, h=4096, v=128256):
        return [
            _row(n, "core", core_ms, 9.0, h=h, v=v),
            _row(n, "greta-kernel", kernel_ms, 1.0, h=h, v=v),
        ]

    # Core faster at N/H 0.125 and 0.25 whatever its memory; at 0.5 one vocabulary of two
    # went to the kernel: 0.25 is the threshold, though core won again at 1.
    rows = (cell(512, 2.0, 3.0) + cell(1024, 4.0, 6.0) + cell(2048, 5.0, 9.0)
            + cell(2048, 9.0, 8.0, v=262144) + cell(4096, 9.0, 12.0))  # fmt: skip
    assert grid.suggested_threshold(rows) == 0.25
    # Capped at DELEGATE_MAX_N_PER_H: core's wins at N/H 2 and 4 do not count.
    rows = cell(4096, 1.0, 2.0) + cell(8192, 1.0, 2.0) + cell(16384, 1.0, 2.0)
    assert grid.DELEGATE_MAX_N_PER_H == 1.0
    assert grid.suggested_threshold(rows) == 1.0
    assert grid.suggested_threshold(cell(512, 4.0, 3.0)) is None


def test_unknown_variant_is_refused_in_one_line(grid, capsys) -> None:
    with pytest.raises(SystemExit):
        grid.main(["--out", "unused", "--variants", "greta,cudnn"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "unknown variant(s): cudnn" in err


@cpu_cells
def test_main_on_cpu_writes_rows_summary_and_the_table(grid, tmp_path, capsys) -> None:
    out = tmp_path / "lce"
    args = ["--device", "cpu", "--out", str(out), "--tokens", "16,32", "--vocabs", "40",
            "--hiddens", "16", "--variants", "core,naive,greta"]  # fmt: skip
    assert grid.main(args) == 0
    doc = json.loads((out / "lce_grid.json").read_text())
    assert [(r["tokens"], r["variant"], r["status"]) for r in doc["rows"]] == [
        (16, "core", "ok"), (16, "naive", "ok"), (16, "greta", "ok"),
        (32, "core", "ok"), (32, "naive", "ok"), (32, "greta", "ok"),
    ]  # fmt: skip
    ms = {(r["tokens"], r["variant"]): r["ms"] for r in doc["rows"]}
    for s in doc["summary"]:
        n = s["tokens"]
        assert s["greta_impl"] == "triton-interpret" and s["best_core"] == "core"
        assert s["greta_vs_core"] == pytest.approx(ms[(n, "greta")] / ms[(n, "core")])
        assert "greta_vs_liger_mem" not in s  # no Liger, no memory columns on CPU
    assert {s["tokens"] for s in doc["summary"]} == {16, 32}
    assert doc["metadata"]["device"] == "cpu" and doc["metadata"]["torch_core_api"]
    assert doc["command"].startswith("python bench/lce_grid.py --device cpu --out <out> ")
    with (out / "lce_grid.csv").open() as fh:
        assert len(list(csv.DictReader(fh))) == 6
    assert (out / "lce_grid_summary.csv").is_file()
    printed = capsys.readouterr().out
    assert "suggested N_per_H_max" in printed.splitlines()[-1]


@cpu_cells
def test_config_runs_every_greta_variant_under_the_change(grid, tmp_path) -> None:
    out = tmp_path / "lce"
    change = {"linear_cross_entropy_dispatch": {"backend": "torch"}}
    args = ["--device", "cpu", "--out", str(out), "--tokens", "16", "--vocabs", "40",
            "--hiddens", "16", "--variants", "greta", "--config", json.dumps(change)]  # fmt: skip
    assert grid.main(args) == 0
    doc = json.loads((out / "lce_grid.json").read_text())
    assert doc["metadata"]["config"] == change
    assert [r["impl"] for r in doc["rows"]] == ["torch-linear-ce"]


def test_config_that_is_not_an_op_mapping_is_refused_in_one_line(grid, capsys) -> None:
    with pytest.raises(SystemExit):
        grid.main(["--out", "unused", "--config", '{"linear_cross_entropy": 0.5}'])
    assert "--config must map op names to objects" in capsys.readouterr().err


def _run_doc(rows, torch_version="2.15.0", config=None, tree="t0", jax="0.12.0"):
    versions = {"torch": torch_version, "triton": "3.9.0", "jax": jax}
    meta = {"gpu_name": "NVIDIA H200", "versions": versions, "config": config,
            "commit": {"commit": "abc"}, "tree": tree, "date": "2026-11-28"}  # fmt: skip
    return {"metadata": meta, "command": "python bench/lce_grid.py --out <out>", "rows": rows}


def test_merge_folds_later_runs_over_earlier_ones_and_resummarizes(grid, tmp_path) -> None:
    first = _run_doc([_row(512, "core", 3.0, 1.1), _row(512, "greta", 6.0, 1.0, "triton"),
                      _row(512, "liger", 0.0, 0.0) | {"status": "skipped"}])  # fmt: skip
    first["not_run_budget"] = ["512x4096x128256", "8192x4096x128256"]
    liger = _run_doc([_row(512, "liger", 9.0, 1.0)], tree="t1", jax="0.11.2")
    deleg = _run_doc(
        [_row(512, "core", 2.9, 1.1), _row(512, "greta", 3.0, 1.1, "torch-linear-ce")],
        config={"linear_cross_entropy_dispatch": {"backend": "torch"}},
    )
    paths = []
    for name, doc in (("a", first), ("b", liger), ("c", deleg)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(doc))
    out = tmp_path / "merged"
    assert grid.main(["--out", str(out), "--merge", *map(str, paths)]) == 0
    doc = json.loads((out / "lce_grid.json").read_text())
    by = {r["variant"]: r for r in doc["rows"]}
    assert [r["variant"] for r in doc["rows"]] == ["core", "greta", "liger"]  # first-seen order
    assert by["core"]["ms"] == 2.9 and by["greta"]["impl"] == "torch-linear-ce"
    assert by["liger"]["status"] == "ok"
    (s,) = doc["summary"]
    assert s["greta_vs_core"] == pytest.approx(3.0 / 2.9) and s["verdict"] == "delegates"
    assert [m["config"] for m in doc["metadata"]["merged"]] == [
        None,
        None,
        deleg["metadata"]["config"],
    ]
    # Each run's own tree and versions: a stack check passes on torch/Triton/GPU alone.
    assert [m["tree"] for m in doc["metadata"]["merged"]] == ["t0", "t1", "t0"]
    assert doc["metadata"]["merged"][1]["versions"]["jax"] == "0.11.2"
    with (out / "lce_grid_summary.csv").open() as fh:
        assert [r["verdict"] for r in csv.DictReader(fh)] == ["delegates"]
    # The first run's budget left 8192 tokens out, and no later run measured them.
    assert doc["not_run_budget"] == ["8192x4096x128256"]


def test_merging_into_a_merged_grid_keeps_every_run(grid, tmp_path) -> None:
    runs = [_run_doc([_row(512, v, ms, 1.0)], tree=t) for v, ms, t in
            (("core", 3.0, "t0"), ("liger", 9.0, "t1"), ("greta", 2.0, "t2"))]  # fmt: skip
    paths = []
    for i, doc in enumerate(runs):
        paths.append(tmp_path / f"{i}.json")
        paths[-1].write_text(json.dumps(doc))
    out = tmp_path / "merged"
    assert grid.main(["--out", str(out), "--merge", str(paths[0]), str(paths[1])]) == 0
    assert grid.main(["--out", str(out), "--merge", str(paths[2])]) == 0
    doc = json.loads((out / "lce_grid.json").read_text())
    # The grid merged before lists its two runs, not itself as one: three runs in all.
    assert [m["tree"] for m in doc["metadata"]["merged"]] == ["t0", "t1", "t2"]
    assert doc["metadata"]["merge_command"].endswith("--merge <run3>")
    assert [r["variant"] for r in doc["rows"]] == ["core", "liger", "greta"]


def test_merge_refuses_runs_on_different_stacks_in_one_line(grid, tmp_path, capsys) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_run_doc([_row(512, "core", 3.0, 1.1)])))
    b.write_text(json.dumps(_run_doc([_row(512, "liger", 9.0, 1.0)], torch_version="2.11.0")))
    with pytest.raises(SystemExit):
        grid.main(["--out", str(tmp_path / "m"), "--merge", str(a), str(b)])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "refusing to merge runs on different stacks: torch 2.15.0 vs 2.11.0" in err
    assert not (tmp_path / "m" / "lce_grid.json").exists()
