"""GRETA's per-user cache directory: the launchers and the Triton-key memo live under it."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """GRETA's per-user cache (``GRETA_CACHE_DIR`` overrides the platform default;
    a value no path can be is LocationError, a GretaError, in one line)."""
    from greta_install.commandline import location

    override = os.environ.get("GRETA_CACHE_DIR", "").strip()
    if override:
        location(override, "GRETA_CACHE_DIR")
        return Path(override)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("greta", appauthor=False))
