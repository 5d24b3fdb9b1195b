"""Serve precompiled kernels from an installed GRETA kernel wheel to Triton's JIT.

``activate()`` installs a Triton cache manager (``triton.knobs.cache.manager_class``)
that looks a compiled kernel up first in the read-only ``precompiled/`` directory of
each installed ``greta_kernels_<arch>`` wheel, and otherwise defers to the cache
manager that was active before (Triton's on-disk cache by default), which also receives
every write. Nothing depends on ``TRITON_CACHE_DIR`` (jax-triton blanks it on import).

Why a cache manager: the JIT computes a cache key from Triton's own build, the kernel
source, the call's specialisation (types, 16-byte divisibility, constexprs), the
options and the backend (target arch; for CUDA also the bundled ptxas version). The
AOT compiler (``greta_core.kernel_wheels.aot``) compiles through that same JIT path for the target
arch, so a call the wheel covers finds its entry under the same key and Triton loads
the binary instead of compiling; a call it does not cover misses and compiles as usual.

The same manager serves the host launchers ``greta warm`` built
(``greta_core.kernel_wheels.host_launchers``), and ``activate()`` hands Triton its remembered build key
(``greta_core.kernel_wheels.triton_key_memo``), the two host-side costs of a first launch.

Op launchers call ``activate()`` before their first launch; after the first call it is
one boolean test. ``GRETA_PRECOMPILED=0`` turns it off (benchmarks, debugging).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import os
from pathlib import Path
from typing import Any

from greta_core import observe
from greta_install.kernel_names import distribution_name, package_name, wheel_archs

logger = logging.getLogger("greta")

_activated = False
_roots: list[Path] = []  # precompiled/ directories of the usable installed wheels
_said: set[str] = set()
_unused: dict[str, str] = {}  # arch -> why its installed wheel's code is not served


def _say_once(topic: str, message: str, *args: Any) -> None:
    if topic not in _said:
        _said.add(topic)
        logger.debug("greta: " + message, *args)


def installed_wheel_dirs() -> list[tuple[str, Path]]:
    """(arch, package directory) of each GRETA kernel wheel importable here: any arch the
    installer builds a wheel for (``wheel_archs``), not only those with tuned tables."""
    found = []
    for arch in wheel_archs():
        try:
            spec = importlib.util.find_spec(package_name(arch))
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.submodule_search_locations and _installed(arch):
            found.append((arch, Path(next(iter(spec.submodule_search_locations)))))
    return found


def _installed(arch: str) -> bool:
    """The package has its distribution metadata: files an interrupted install left
    behind without a dist-info are not a kernel wheel."""
    import importlib.metadata

    try:
        importlib.metadata.version(distribution_name(arch))
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def read_manifest(package_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((package_dir / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@functools.lru_cache(maxsize=1)
def current_triton_fingerprint() -> str:
    from greta_core.kernel_wheels.aot import triton_fingerprint

    return triton_fingerprint()


def activate() -> bool:
    """Serve installed kernel wheels' precompiled code; True when at least one is usable."""
    global _activated
    if _activated:
        return bool(_roots)
    _activated = True
    if os.environ.get("GRETA_PRECOMPILED", "1").strip().lower() in ("0", "false", "no", "off"):
        _say_once("off", "GRETA_PRECOMPILED=0: kernel wheel code not used, Triton compiles")
        return False
    try:
        return _activate()
    except Exception as exc:  # never let the fast path break a launch
        _say_once("activate", "precompiled kernels disabled (%s)", exc)
        return False


def _activate() -> bool:
    import triton
    from triton import knobs

    wheels = installed_wheel_dirs()
    if not wheels:
        _say_once("none", "no GRETA kernel wheel installed: Triton compiles kernels on first use")
        return False
    from greta_install.install.kernel_build import recorded_state

    for arch, package_dir in wheels:
        if recorded_state(package_dir.parent, arch) == "differs":
            # Verified once (greta warm / greta install recorded its content), changed since.
            _unused[arch] = "changed since it was verified: run `greta warm` to check it again"
            _say_once(f"changed:{arch}", "kernel wheel for %s changed since it was verified", arch)
            continue
        manifest = read_manifest(package_dir)
        if manifest is None:
            _unused[arch] = "no readable manifest.json"
            _say_once(f"manifest:{arch}", "kernel wheel for %s has no readable manifest", arch)
            continue
        built_with = manifest.get("triton_version")
        if built_with != triton.__version__:
            _unused[arch] = (
                f"built for triton {built_with}, installed triton is {triton.__version__}"
            )
            _say_once(
                f"version:{arch}",
                "kernel wheel for %s holds code for triton %s, installed triton is %s: "
                "compiling as usual (tuned configs still apply)",
                arch,
                built_with,
                triton.__version__,
            )
            continue
        root = package_dir / "precompiled"
        if root.is_dir():
            _roots.append(root)
        else:
            _unused[arch] = "no precompiled/ directory"
    if not _roots:
        return False
    _add_host_side()
    previous = knobs.cache.manager_class
    if previous is not WheelCacheManager:
        WheelCacheManager.fallback = previous
        knobs.cache.manager_class = WheelCacheManager
    return True


def status() -> list[dict[str, Any]]:
    """Each installed kernel wheel as the runtime sees it (activating first): arch,
    distribution, the Triton version and fingerprint it was built with, and whether its
    code is served to Triton here ("in_use"; "why_not" says why not)."""
    activate()
    rows = []
    for arch, package_dir in installed_wheel_dirs():
        manifest = read_manifest(package_dir) or {}
        in_use = (package_dir / "precompiled") in _roots
        rows.append({
            "arch": arch,
            "distribution": distribution_name(arch),
            "triton_version": manifest.get("triton_version", ""),
            "triton_fingerprint": manifest.get("triton_fingerprint", ""),
            "kernels": len(manifest.get("kernels", [])),
            "in_use": in_use,
            "why_not": "" if in_use else _unused.get(arch, "GRETA_PRECOMPILED=0 or not activated"),
        })  # fmt: skip
    return rows


def _add_host_side() -> None:
    """Host launchers built by `greta warm`, and Triton's remembered build key."""
    from greta_core.kernel_wheels import host_launchers, triton_key_memo

    try:
        launchers = host_launchers.launcher_dir()
        if launchers.is_dir():
            _roots.append(launchers)
        else:
            _say_once(
                "warm",
                "host launchers not built: the first launch compiles them (run `greta warm`)",
            )
        if not triton_key_memo.seed():
            _say_once("key", "Triton's build key is not remembered for this Triton: hashing it")
    except Exception as exc:  # an unreadable cache must never cost more than the slow path
        _say_once("host", "host-side warm-up unavailable (%s)", exc)


def deactivate() -> None:
    """Undo `activate()` (tests, benchmarks comparing with and without the wheel)."""
    global _activated
    from triton import knobs

    if knobs.cache.manager_class is WheelCacheManager:
        knobs.cache.manager_class = WheelCacheManager.fallback
    WheelCacheManager.fallback = None
    _roots.clear()
    _said.clear()
    _unused.clear()
    _activated = False


def add_root(path: str | os.PathLike[str]) -> None:
    """Serve a precompiled directory that is not an installed wheel (tests, local builds)."""
    from triton import knobs

    global _activated
    _activated = True
    _roots.append(Path(path))
    if knobs.cache.manager_class is not WheelCacheManager:
        WheelCacheManager.fallback = knobs.cache.manager_class
        knobs.cache.manager_class = WheelCacheManager


def _file_cache(key: str, override: bool, dump: bool) -> Any:
    from triton import knobs
    from triton.runtime.cache import FileCacheManager

    if override or dump or knobs.cache.dir:
        return FileCacheManager(key, override=override, dump=dump)
    # TRITON_CACHE_DIR="" (jax-triton sets that on import) leaves Triton without a cache
    # directory and every compile fails; fall back to Triton's default location.
    manager = FileCacheManager.__new__(FileCacheManager)
    manager.key = key
    manager.cache_dir = os.path.join(knobs.cache.get_triton_dir("cache"), key)
    manager.lock_path = os.path.join(manager.cache_dir, "lock")
    os.makedirs(manager.cache_dir, exist_ok=True)
    return manager


class WheelCacheManager:
    """Triton CacheManager: read-only wheel entries first, then the previous manager."""

    fallback: Any = None  # the manager class active before activate(); None = file cache

    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        self.key = key
        self._override = override
        self._dump = dump
        self._inner: Any = None
        self._dir: Path | None = None
        if not (override or dump):
            for root in _roots:
                candidate = root / key
                if candidate.is_dir():
                    self._dir = candidate
                    break

    @property
    def inner(self) -> Any:
        if self._inner is None:
            cls = WheelCacheManager.fallback
            if cls is None:
                self._inner = _file_cache(self.key, self._override, self._dump)
            else:
                self._inner = cls(self.key, override=self._override, dump=self._dump)
        return self._inner

    def get_file(self, filename: str) -> str | None:
        if self._dir is not None and (self._dir / filename).is_file():
            return str(self._dir / filename)
        return self.inner.get_file(filename)

    def get_group(self, filename: str) -> dict[str, str] | None:
        if self._dir is not None:
            group = self._wheel_group(filename)
            if group is not None:
                return group
        group = self.inner.get_group(filename)
        if group is None and _roots and filename.endswith(".json") and not self._dump:
            self._explain_miss(filename[: -len(".json")])
        return group

    def _wheel_group(self, filename: str) -> dict[str, str] | None:
        assert self._dir is not None
        try:
            data = json.loads((self._dir / f"__grp__{filename}").read_text())
            children = data["child_paths"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        group = {}
        for child in children:
            path = self._dir / Path(child).name
            if not path.is_file():
                return None  # an incomplete entry is a miss, never a half-loaded kernel
            group[child] = str(path)
        _say_once(f"hit:{filename}", "%s: precompiled code from the kernel wheel", filename[:-5])
        observe.record_kernel_code(filename[: -len(".json")], "precompiled")
        return group

    def _explain_miss(self, kernel: str) -> None:
        if kernel in {"cuda_utils", "hip_utils", "__triton_launcher"}:
            return
        observe.record_kernel_code(kernel, "compiled")
        try:
            fingerprint = current_triton_fingerprint()
        except Exception:
            fingerprint = ""
        for root in _roots:
            manifest = read_manifest(root.parent) or {}
            if fingerprint and manifest.get("triton_fingerprint") not in (None, fingerprint):
                _say_once(
                    f"fingerprint:{root}",
                    "kernel wheel %s was built by a different triton build (same version, "
                    "other Python or platform): compiling as usual",
                    manifest.get("package", root.parent.name),
                )
                return
        _say_once(
            f"miss:{kernel}",
            "%s: this call's specialisation is not in the kernel wheel "
            "(dtype, alignment, int divisibility or options differ): compiling",
            kernel,
        )

    def put(self, data: Any, filename: str, binary: bool = True) -> str:
        return self.inner.put(data, filename, binary=binary)

    def put_group(self, filename: str, group: dict[str, str]) -> Any:
        return self.inner.put_group(filename, group)
