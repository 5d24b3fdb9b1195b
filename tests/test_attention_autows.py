"""bench/attention_autows.py without a GPU: how it reads a child's end (result, hang,
abort) and its sm_90 compile of one config into the warp-specialised form."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _script_module import load_script

pytest.importorskip("triton")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def autows():
    return load_script("bench/attention_autows.py")


ASSERT = (
    "python: /x/WSLowerToken.cpp:73: void mlir::processProducerCommitOp(...): "
    "Assertion `false' failed."
)


@pytest.mark.parametrize(
    ("code", "stdout", "stderr", "want"),
    [
        (0, 'launching\nRESULT {"status": "ok", "ws_ms": 1.5}\n', "", {"status": "ok", "ws_ms": 1.5}),
        (None, "launching\n", "", {"status": "hang", "detail": "no result within the time limit (launch)"}),
        (None, "", "", {"status": "hang", "detail": "no result within the time limit (compile or set-up)"}),
        (-6, "", f"Traceback\n{ASSERT}\nmodule {{\n}}\n", {"status": "compile-error", "detail": ASSERT}),
        (1, "", "Traceback (most recent call last):\nRuntimeError: PassManager::run failed\n",
         {"status": "compile-error", "detail": "RuntimeError: PassManager::run failed"}),
        (3, "", "", {"status": "compile-error", "detail": "exit code 3"}),
    ],
)  # fmt: skip
def test_classify_reads_how_a_child_ended(autows, code, stdout, stderr, want):
    assert autows.classify(code, stdout, stderr) == want


def test_dry_run_compiles_a_config_into_producer_and_consumer_warp_groups(autows, capsys, tmp_path):
    index = autows.CONFIGS.index(("fwd", 64, 64, 64, 2))
    out = tmp_path / "autows.json"
    assert autows.main(["--dry-run", "--only", str(index), "--out", str(out)]) == 0
    row = json.loads(capsys.readouterr().out.splitlines()[0])
    doc = json.loads(out.read_text())
    assert doc["rows"] == [row]
    assert doc["metadata"]["preset"] == "attention_autows"
    # The command names the output folder as <out>, never this machine's path.
    assert doc["command"] == (
        f"python bench/attention_autows.py --dry-run --only {index} --out <out>/autows.json"
    )
    assert row["config"] == "fwd D64 64x64 s2"
    assert row["status"] == "compiled"
    # One producer warp group beside the two consumer groups of the kernel's 4 warps each.
    assert row["warp_specialized"] is True
    assert row["num_warps"] == 12
