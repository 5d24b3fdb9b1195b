"""Triton's host-side launch code for a kernel wheel: described at build time, built at install.

The kernel wheel removes the device compile, but the first launch of a Triton kernel in a
process still builds two small CPython extension modules with the system C compiler: the
driver helpers (``cuda_utils`` / ``hip_utils``, once per machine) and one
``__triton_launcher`` per kernel signature. On the H100 that, with Triton hashing its own
build (``greta_core.kernel_wheels.triton_key_memo``), is most of what is left of the first call once the
device code comes from the wheel.

Those modules cannot ship in a ``py3-none-any`` wheel: they link the user's Python, and
on ROCm the launcher's C source even embeds where ``libamdhip64.so`` lives. So the wheel
ships ``launchers.json``, one entry per distinct launcher: the kernel signature in argument
order and the wheel entry whose metadata Triton's launcher class reads. ``greta warm``
(run by ``greta install`` after it installs the wheel) hands each entry to Triton's own
launcher class on the user's machine, which generates and builds the module exactly as at
a first launch, into GRETA's launcher cache (``launcher_dir()``) instead of the user's.
``greta_core.kernel_wheels.precompiled`` serves that directory to Triton next to the wheel.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import os
import sys
import sysconfig
import time
from collections import namedtuple
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from greta_core.errors import AotError, GretaError, KernelWheelError
from greta_core.kernel_wheels import triton_key_memo
from greta_core.kernel_wheels.cache import cache_root
from greta_install import triton_range

SPECS_FILE = "launchers.json"
# Triton backend name -> (driver module, launcher class, driver helpers class)
_BACKENDS: dict[str, tuple[str, str, str]] = {
    "cuda": ("triton.backends.nvidia.driver", "CudaLauncher", "CudaUtils"),
    "hip": ("triton.backends.amd.driver", "HIPLauncher", "HIPUtils"),
}


def per_signature_launchers() -> bool:
    """True where the installed Triton builds a launcher module per kernel signature (3.6);
    3.7+ launch every kernel through the driver helpers' generic launcher, so a wheel's
    launcher specs need nothing built beyond the helpers (greta_install.triton_range)."""
    import triton

    return triton_range.per_signature_launcher(triton.__version__)


def launcher_dir() -> Path:
    """Built launcher modules, laid out like Triton's cache: ``<key>/<module><EXT_SUFFIX>``.

    Shared by the user's environments: Triton's key hashes the C source and the file name
    carries the Python ABI, so one environment never loads another's module.
    """
    return cache_root() / "launchers"


# --- describing (build time, any machine) -----------------------------------------------


def spec_of(compiled: Any, entry: str) -> dict[str, Any]:
    """What Triton's launcher class needs from a compiled kernel, as JSON.

    `entry` is the kernel's directory under the wheel's ``precompiled/``; its metadata
    file supplies the rest (warp size, scratch sizes, tensor descriptors).
    """
    return {
        "backend": compiled.metadata.target.backend,
        "signature": [[name, str(ty)] for name, ty in compiled.src.signature.items()],
        "entry": entry,
        "kernel": compiled.metadata.name,
    }


def spec_digest(spec: dict[str, Any], metadata: dict[str, Any]) -> str:
    """Identity of the launcher a spec produces: equal digests, equal C source."""
    key = [
        spec["backend"],
        spec["signature"],
        metadata.get("warp_size"),
        metadata.get("tensordesc_meta"),
    ]
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def load_metadata(path: Path) -> Any:
    """A kernel's metadata JSON as the namedtuple Triton's CompiledKernel builds from it."""
    from triton.backends.compiler import GPUTarget

    data = json.loads(path.read_text())
    target = data["target"]
    data["target"] = GPUTarget(target["backend"], target["arch"], target["warp_size"])
    return namedtuple("KernelMetadata", sorted(data))(**data)


def _source_object(spec: dict[str, Any]) -> Any:
    # The attributes of an ASTSource that the launcher classes read. The generated C
    # source depends on the signature only; constexpr values are not part of it.
    pairs = [(name, ty) for name, ty in spec["signature"]]
    return SimpleNamespace(
        signature=dict(pairs),
        constants={},
        fn=SimpleNamespace(arg_names=[name for name, _ in pairs]),
    )


def make_launcher(spec: dict[str, Any], metadata: Any) -> Any:
    """Run Triton's launcher class for `spec`: builds (or loads) its module via Triton's cache."""
    module_name, launcher_cls, _ = _BACKENDS[spec["backend"]]
    module = importlib.import_module(module_name)
    return getattr(module, launcher_cls)(_source_object(spec), metadata)


class _Captured(GretaError):
    """Raised (and caught) inside `_capturing`: carries the C source out of the build call."""

    def __init__(self, source: str) -> None:
        super().__init__("captured")
        self.source = source


@contextlib.contextmanager
def _capturing(module: Any) -> Iterator[None]:
    """Make the driver module's build function hand back the C source instead of building."""

    def capture(src: str, name: str, *args: Any, **kwargs: Any) -> Any:
        raise _Captured(src)

    saved = module.compile_module_from_src
    saved_dirs = getattr(module, "library_dirs", None)
    module.compile_module_from_src = capture
    if saved_dirs is not None:
        # Evaluated for the build call's arguments; without libcuda (a CPU machine)
        # Triton's version asserts. The source does not depend on it.
        module.library_dirs = lambda: []
    try:
        yield
    finally:
        module.compile_module_from_src = saved
        if saved_dirs is not None:
            module.library_dirs = saved_dirs


def launcher_source(src: Any, metadata: Any) -> str | None:
    """The C source Triton's launcher class generates for (src, metadata), not built; None
    where this Triton generates none (its generic launcher serves every signature).

    Lets tests check that a spec rebuilt from ``launchers.json`` generates the source the
    JIT generates for the real kernel.
    """
    if not per_signature_launchers():
        return None
    module_name, launcher_cls, _ = _BACKENDS[metadata.target.backend]
    module = importlib.import_module(module_name)
    with _capturing(module):
        try:
            getattr(module, launcher_cls)(src, metadata)
        except _Captured as captured:
            return captured.source
    raise AotError(f"{launcher_cls} built nothing: Triton's launcher changed?")


# --- building (install time, on the user's machine) ------------------------------------


@dataclass
class WarmReport:
    backend: str
    directory: str
    launchers: int = 0  # launcher specs the wheel describes
    modules: int = 0  # distinct C sources among them (one module each)
    built: int = 0  # modules compiled now (the rest were already in the cache)
    ready: int = 0  # specs whose module is now in the launcher cache
    failed: list[str] = field(default_factory=list)  # "<kernel>: <error>"
    utils: str = ""  # "ready" | "failed: ..."
    triton_key: str = ""  # "remembered" | "failed: ..."
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failed and not self.utils.startswith("failed")

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "ok": self.ok}


@contextlib.contextmanager
def _building_into(directory: Path) -> Iterator[None]:
    """Triton's module builds use a plain file cache in `directory` (not the user's cache)."""
    from triton import knobs

    saved_dir, saved_manager = knobs.cache.dir, knobs.cache.manager_class
    knobs.cache.dir = str(directory)
    knobs.cache.manager_class = None
    try:
        yield
    finally:
        knobs.cache.dir, knobs.cache.manager_class = saved_dir, saved_manager


def _module_count(directory: Path) -> int:
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    return sum(1 for _ in directory.glob(f"*/*{suffix}"))


def wheel_specs(package_dir: Path) -> dict[str, dict[str, Any]]:
    """digest -> launcher spec, from an installed wheel's ``launchers.json`` ({} if none)."""
    path = package_dir / SPECS_FILE
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise KernelWheelError(f"{path}: not a JSON object of launcher specs (corrupt wheel?)")
    return data


def warm(
    specs: Iterable[dict[str, Any]],
    precompiled: Path,
    directory: Path | None = None,
    *,
    jobs: int = 0,
    utils: bool = True,
    remember_key: bool = True,
) -> WarmReport:
    """Build Triton's driver helpers and the launcher of every spec into `directory`.

    `precompiled` is the wheel's ``precompiled/`` directory (the kernels' metadata).
    Builds go through Triton's own classes, so they are found by Triton's own lookups.
    """
    specs = list(specs)
    directory = directory or launcher_dir()
    backends = sorted({spec["backend"] for spec in specs})
    start = time.perf_counter()
    report = WarmReport(",".join(backends), str(directory), launchers=len(specs))
    unknown = [b for b in backends if b not in _BACKENDS]
    if unknown:
        report.failed.append(f"no host launchers for Triton backend(s) {unknown}")
        return report
    directory.mkdir(parents=True, exist_ok=True)
    before = _module_count(directory)
    with _building_into(directory):
        if utils:
            for backend in backends:
                module_name, _, utils_cls = _BACKENDS[backend]
                try:
                    getattr(importlib.import_module(module_name), utils_cls)()
                    report.utils = "ready"
                except Exception as exc:  # no GPU runtime library here
                    report.utils = f"failed: {type(exc).__name__}: {exc}".splitlines()[0]

        if not per_signature_launchers():
            # Triton 3.7+: the helpers' generic launcher serves every spec; nothing else
            # is built, so the specs are ready exactly when the helpers are.
            report.ready = len(specs) if not report.utils.startswith("failed") else 0
            specs = []
        # Specs that differ only in pointer dtypes or names share one C source: build
        # each distinct source once (generating one is cheap, building it is not).
        distinct: dict[str, tuple[dict[str, Any], Any]] = {}
        members: dict[str, int] = {}
        errors = []
        for spec in specs:
            try:
                metadata = load_metadata(precompiled / spec["entry"] / f"{spec['kernel']}.json")
                source = launcher_source(_source_object(spec), metadata)
                if source is None:
                    raise AotError("this Triton generates no launcher source")
            except Exception as exc:
                errors.append(f"{spec.get('kernel')}: {type(exc).__name__}: {exc}".splitlines()[0])
                continue
            distinct.setdefault(source, (spec, metadata))
            members[source] = members.get(source, 0) + 1

        def build(source: str) -> str:
            spec, metadata = distinct[source]
            try:
                make_launcher(spec, metadata)
                return ""
            except Exception as exc:
                return f"{spec.get('kernel')}: {type(exc).__name__}: {exc}".splitlines()[0]

        # The C compiler runs in subprocesses: threads keep the cores busy.
        with ThreadPoolExecutor(max_workers=jobs or min(8, os.cpu_count() or 1)) as pool:
            results = dict(zip(distinct, pool.map(build, distinct), strict=True))
        errors += [e for e in results.values() if e]
        report.modules = len(distinct)
        if distinct or per_signature_launchers():
            report.ready = sum(members[src] for src, err in results.items() if not err)
    report.failed.extend(errors)
    report.built = max(0, _module_count(directory) - before)
    if remember_key:
        try:
            triton_key_memo.remember()
            report.triton_key = "remembered"
        except Exception as exc:
            report.triton_key = f"failed: {type(exc).__name__}: {exc}"
    report.seconds = round(time.perf_counter() - start, 2)
    return report


def stamp_path(manifest: dict[str, Any]) -> Path:
    """Where `greta warm` records that a wheel's launchers are built for this Python."""
    launchers = "\n".join(sorted(manifest.get("launchers", [])))
    ident = hashlib.sha256(launchers.encode()).hexdigest()[:16]
    package = str(manifest.get("package", "greta_kernels"))
    return launcher_dir() / "warmed" / f"{package}-{ident}-{sys.implementation.cache_tag}.json"


def write_stamp(manifest: dict[str, Any], report: WarmReport) -> Path:
    path = stamp_path(manifest)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.to_json(), indent=1) + "\n")
    return path


def is_warm(manifest: dict[str, Any]) -> bool:
    """True when `greta warm` built this wheel's launchers for this Python (stdlib only)."""
    if not manifest.get("launchers"):
        return True  # a wheel without launcher specs: nothing to build
    try:
        return bool(json.loads(stamp_path(manifest).read_text()).get("ok"))
    except (OSError, ValueError, AttributeError):
        return False
