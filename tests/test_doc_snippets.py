"""Every ```python snippet in README.md and docs/ runs as written (the CPU paths).

The snippets run in one fresh interpreter, each in its own namespace, as a user would paste
them: no TRITON_INTERPRET / GRETA_TRITON_ON_CPU, so the torch ops take their references.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```", re.DOTALL | re.MULTILINE)

RUNNER = r"""
import json, sys, traceback
failures = []
for name, code in json.load(sys.stdin):
    try:
        exec(compile(code, name, "exec"), {"__name__": "__snippet__"})
    except BaseException:
        failures.append(name + "\n" + traceback.format_exc(limit=3))
print(json.dumps(failures))
"""


def snippets() -> list[tuple[str, str]]:
    """(where, code) for each distinct snippet (en and es pages share most code)."""
    found: dict[str, str] = {}
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = path.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            line = text[: match.start()].count("\n") + 1
            found.setdefault(match.group(1), f"{path.relative_to(ROOT)}:{line}")
    return [(where, code) for code, where in found.items()]


def test_snippets_are_found() -> None:
    where = {w.split(":")[0] for w, _ in snippets()}
    assert "README.md" in where
    assert {"docs/en/transformers.md", "docs/en/kernels_fused.md"} <= where


def test_every_python_snippet_runs() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    pytest.importorskip("transformers")
    env = {
        k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "GRETA_TRITON_ON_CPU")
    }
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", RUNNER],
        input=json.dumps(snippets()),
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    failures = json.loads(done.stdout.strip().splitlines()[-1])
    assert not failures, "\n\n".join(failures)
