"""Remember ``triton.runtime.cache.triton_key()`` across processes.

Every Triton cache key starts with ``triton_key()``: a sha256 over Triton's compiler and
backend sources and its ~400 MB ``libtriton.so``. Triton computes it once per process, on
the first kernel launch, even when the compiled kernel is then loaded from a cache; on
the H100 that hash was 0.48 s of a 0.68 s first call with everything else cached.

``remember()`` (run by ``greta warm``) stores the value under a stamp of the files Triton
hashes (path, size, mtime); ``seed()`` (run when GRETA activates the kernel wheel) hands
the stored value to Triton only if the stamp still matches, so a reinstalled or upgraded
Triton is hashed again as usual. ``GRETA_PRECOMPILED=0`` turns seeding off with the rest
of the kernel-wheel fast path.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

_FILE = "triton_key.json"


def triton_files(root: Path) -> list[Path]:
    """Every file ``triton_key()`` may read: a superset (all files under compiler/ and
    backends/, runtime/cache.py, _C/libtriton.*), so a change to any of them is seen."""
    files = [root / "runtime" / "cache.py"]
    for sub in ("compiler", "backends"):
        files.extend(
            p for p in (root / sub).rglob("*") if p.is_file() and "__pycache__" not in p.parts
        )
    files.extend((root / "_C").glob("libtriton.*"))
    return sorted(files)


def stamp(root: Path) -> str:
    """sha256 of (relative path, size, mtime_ns) of `triton_files(root)` and the Python ABI."""
    digest = hashlib.sha256(sys.implementation.cache_tag.encode())
    for path in triton_files(root):
        st = path.stat()
        digest.update(f"{path.relative_to(root)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _triton_root() -> Path:
    import triton

    return Path(triton.__file__).resolve().parent


def memo_path() -> Path:
    from greta_core.kernel_wheels.cache import cache_root

    return cache_root() / _FILE


def remember(path: Path | None = None, root: Path | None = None) -> str:
    """Compute Triton's key the way Triton does and store it with the current stamp."""
    from triton.runtime.cache import triton_key

    path = path or memo_path()
    root = root or _triton_root()
    value = triton_key()
    try:
        data = json.loads(path.read_text())
        entries = data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        entries = {}
    entries[stamp(root)] = value
    # A handful of Triton installs per user at most; keep the newest few.
    entries = dict(list(entries.items())[-8:])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(entries, indent=1) + "\n")
    os.replace(tmp, path)
    return value


def lookup(path: Path | None = None, root: Path | None = None) -> str | None:
    """The remembered key for the installed Triton, or None when it changed or is unknown."""
    try:
        entries = json.loads((path or memo_path()).read_text())
        value = entries.get(stamp(root or _triton_root())) if isinstance(entries, dict) else None
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and value else None


def seed(path: Path | None = None, root: Path | None = None) -> bool:
    """Give Triton the remembered key (True), unless Triton already computed it or the
    stamp no longer matches (False)."""
    import triton.runtime.cache as cache

    current: Any = cache.triton_key
    if getattr(current, "greta_seeded", False):
        return True
    info = getattr(current, "cache_info", None)
    if info is None or info().currsize:
        return False  # computed already in this process, or not the function we know
    value = lookup(path, root)
    if value is None:
        return False

    @functools.lru_cache
    def triton_key() -> str:
        return value

    triton_key.greta_seeded = True  # type: ignore[attr-defined]
    cache.triton_key = triton_key
    autotuner = sys.modules.get("triton.runtime.autotuner")
    if autotuner is not None and getattr(autotuner, "triton_key", None) is current:
        autotuner.triton_key = triton_key
    return True
