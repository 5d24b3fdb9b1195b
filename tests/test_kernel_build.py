"""The kernel-wheel step: cache keyed by arch + Triton + GRETA source, static index.

The real build (minutes per arch) runs on the GPU machine (scripts in the report); here
the cache, the reuse path and the static PEP 503 index are tested (progress relaying and
the parallel build: tests/test_kernel_build_parallel.py)
with real wheel files and the installer's own lookup.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest
from _install_helpers import Index, make_kernel_wheel

from greta_install.install import kernel_build as kb
from greta_install.install.installer import find_kernel_wheel


def test_cache_key_changes_with_each_input() -> None:
    base = kb.cache_key("gfx942", "f" * 32, "s" * 64)
    assert base.startswith("gfx942-")
    assert kb.cache_key("gfx1100", "f" * 32, "s" * 64) != base
    assert kb.cache_key("gfx942", "e" * 32, "s" * 64) != base
    assert kb.cache_key("gfx942", "f" * 32, "t" * 64) != base
    assert kb.cache_key("gfx942", "f" * 32, "s" * 64) == base


def test_source_hash_is_stable_and_read_without_importing_greta_core() -> None:
    import sys

    before = set(sys.modules)
    first = kb.greta_source_hash()
    assert first == kb.greta_source_hash() and len(first) == 64
    assert not {m for m in set(sys.modules) - before if m.startswith(("torch", "triton", "jax"))}


def test_a_cached_wheel_is_reused_without_building(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GRETA_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GRETA_HASH_RECORD", str(tmp_path / "hashes.json"))
    monkeypatch.setattr(kb, "triton_fingerprint", lambda python: "f" * 32)
    entry = kb.cache_root() / kb.cache_key("gfx942", "f" * 32, kb.greta_source_hash())
    entry.mkdir(parents=True)
    filename, data = make_kernel_wheel("gfx942", triton_fingerprint="f" * 32)
    (entry / filename).write_bytes(data)

    def no_build(*args: object, **kw: object) -> None:
        raise AssertionError("a cached wheel must not be rebuilt")

    monkeypatch.setattr(kb, "_run_with_progress", no_build)
    logged: list[str] = []
    built = kb.build_or_reuse("python", "gfx942", log=logged.append)
    assert built.cached and built.path == entry / filename
    assert built.sha256 == hashlib.sha256(data).hexdigest()
    assert any("reusing the cached build" in line for line in logged)
    # A torn entry (truncated wheel) is not reused: the build runs.
    (entry / filename).write_bytes(data[: len(data) // 2])
    with pytest.raises(AssertionError, match="must not be rebuilt"):
        kb.build_or_reuse("python", "gfx942", log=logged.append)


def test_static_index_serves_directory_and_http_lookups(tmp_path: Path) -> None:
    wheels = []
    for arch in ("gfx942", "sm_90"):
        filename, data = make_kernel_wheel(arch)
        (tmp_path / filename).write_bytes(data)
        wheels.append(tmp_path / filename)
    out = tmp_path / "index"
    kb.write_index(wheels[:1], out)
    kb.write_index(wheels[1:], out)  # grows arch by arch
    sums = (out / "SHA256SUMS").read_text().splitlines()
    assert len(sums) == 2
    digest = hashlib.sha256(wheels[0].read_bytes()).hexdigest()
    assert f"{digest}  {wheels[0].name}" in sums
    # As a directory source:
    found = find_kernel_wheel(str(out), "greta-kernels-gfx942==0.1.0")
    assert found.location == str(out / wheels[0].name) and found.sha256 == digest
    # As an index a web server serves (pages + files laid out like the test index):
    page = (out / "greta-kernels-sm-90" / "index.html").read_text()
    assert f"../{wheels[1].name}#sha256=" in page
    files = {p.name: p.read_bytes() for p in out.glob("*.whl")}
    with Index(files, {}) as index:
        hit = find_kernel_wheel(index.url, "greta-kernels-sm-90==0.1.0", allow_http=True)
    assert hit.location and hit.location.endswith(wheels[1].name)


def test_source_hash_covers_what_decides_what_is_compiled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util
    import shutil

    real = Path(next(iter(importlib.util.find_spec("greta_core").submodule_search_locations)))
    copy = tmp_path / "greta_core"
    shutil.copytree(real, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "greta_core" or m.startswith("greta_core.")]:
        monkeypatch.delitem(sys.modules, name)
    base, with_table = kb.greta_source_hash(), kb.greta_source_hash('{"ops": {}}')
    assert base != with_table != kb.greta_source_hash('{"ops": {"x": {}}}')
    for rel in ("configs/blocks.py", "kernel_wheels/aot.py", "kernels/vec_add.py",
                "configs/tables/gfx942.json", "ops/declare.py", "ops/rope.py",
                "ops/vec_add.py"):  # fmt: skip
        path = copy / rel
        saved = path.read_bytes()
        path.write_bytes(saved + b"\n# changed\n")
        assert kb.greta_source_hash() != base, rel
        path.write_bytes(saved)
    assert kb.greta_source_hash() == base
