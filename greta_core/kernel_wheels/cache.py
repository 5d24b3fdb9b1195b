"""GRETA's per-user cache directory: the launchers and the Triton-key memo live under it."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """GRETA's per-user cache (``GRETA_CACHE_DIR`` overrides the platform default)."""
    override = os.environ.get("GRETA_CACHE_DIR", "").strip()
    if override:
        return Path(override)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("greta", appauthor=False))
