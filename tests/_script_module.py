"""Load a repository script (bench/, examples/: scripts, not packages) as a module."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def load_script(relative: str, name: str | None = None) -> ModuleType:
    """`relative` (e.g. ``bench/hf_llama.py``) executed as module `name` (its stem by
    default), registered in sys.modules first: dataclasses look their module up there."""
    path = REPO / relative
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
