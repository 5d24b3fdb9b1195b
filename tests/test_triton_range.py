"""The supported Triton range (greta_install.triton_range) and the eager launch adapter per
Triton version (greta_core.ops._direct.launch_form).

Each adapter is checked against Triton's own ``CudaLauncher.__call__``: the wrapper is run
with a recording C ``launch`` and must hand it exactly what the adapter hands it. On the
installed Triton (the CPU row's, or the GPU stack's) that is Triton's real class; for every
other version in the range, the method as that version's wheel ships it
(tests/data/triton_launchers/). Outside the range the fast path is off, visibly.
"""

from __future__ import annotations

import re
import types
from pathlib import Path
from typing import Any

import pytest

from greta_core import observe
from greta_core.ops import _direct
from greta_install import triton_range

DATA = Path(__file__).parent / "data" / "triton_launchers"
SHIPPED = sorted(DATA.glob("cuda_launcher_call_*.py.txt"))


def _version_of(path: Path) -> str:
    match = re.fullmatch(r"cuda_launcher_call_(\d+)_(\d+)_(\d+)\.py\.txt", path.name)
    assert match, path.name
    return ".".join(match.groups())


class CudaLauncher:  # the name launch_form looks for; attributes as Triton's __init__ sets
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.global_scratch_size = self.profile_scratch_size = 0
        self.global_scratch_align = self.profile_scratch_align = 1
        self.num_ctas = 1
        self.launch_cooperative_grid, self.launch_pdl = False, True
        self.gsan_enabled = False
        self.arg_annotations = ("annotation",)
        self.kernel_signature = b"signature"
        self.launch = lambda *a: self.calls.append(a)


def _stub_triton_globals() -> dict[str, Any]:
    allocation = types.SimpleNamespace(
        _allocator=None, _profile_allocator=None, has_profile_allocator=lambda: False
    )
    driver = types.SimpleNamespace(active=object())  # read, never called without scratch
    triton = types.SimpleNamespace(runtime=types.SimpleNamespace(driver=driver))
    return {"triton": triton, "_allocation": allocation, "GSAN_PER_DEVICE_STATE_STRIDE": 0}


# What JITFunction.run passes CompiledKernel.run (grid, stream, function, packed metadata,
# launch metadata, the two hooks: unset whenever the direct path runs) and kernel arguments.
_GRID_STREAM = (4, 2, 1, 77)
_KERNEL_ARGS = (1234, 5, 5678, True)


def _by_wrapper(call: Any) -> tuple[Any, ...]:
    launcher = CudaLauncher()
    call(launcher, *_GRID_STREAM, "function", "packed", None, None, None, *_KERNEL_ARGS)
    (made,) = launcher.calls
    return made


def _by_adapter(convention: str) -> tuple[Any, ...]:
    launcher = CudaLauncher()
    fn, between = _direct.launch_form(launcher, "function", "packed", convention)
    assert type(fn) is not CudaLauncher  # Triton's Python wrapper is skipped
    fn(*_GRID_STREAM, *between, *_KERNEL_ARGS)
    (made,) = launcher.calls
    return made


def test_every_supported_version_has_a_shipped_launcher_to_check_against() -> None:
    versions = {triton_range.parse(_version_of(p)) for p in SHIPPED}
    assert versions == set(triton_range.LAUNCH_CONVENTIONS)
    assert triton_range.supported_text() == "3.6-3.9"


@pytest.mark.parametrize("path", SHIPPED, ids=[_version_of(p) for p in SHIPPED])
def test_adapter_hands_the_c_launcher_what_tritons_wrapper_does(path: Path) -> None:
    namespace = _stub_triton_globals()
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    convention = triton_range.launch_convention(_version_of(path))
    assert convention is not None
    assert _by_adapter(convention) == _by_wrapper(namespace["__call__"])


def test_adapter_matches_the_installed_tritons_launcher() -> None:
    triton = pytest.importorskip("triton")
    nvidia = pytest.importorskip("triton.backends.nvidia.driver")  # absent from ROCm-only builds
    from triton.runtime.driver import driver

    convention = triton_range.launch_convention(triton.__version__)
    if convention is None:  # outside the range: the fast path must be off, visibly
        assert _direct.support() is None
        assert "not supported" in (observe.last_implementation("fast_launch") or "")
        return
    saved = driver._active
    driver.set_active(types.SimpleNamespace())  # 3.7+ reads driver.active; no GPU here
    try:
        made = _by_wrapper(nvidia.CudaLauncher.__call__)
    finally:
        driver._active = saved
    assert _by_adapter(convention) == made


def test_wrapper_kept_where_it_does_more_than_constants() -> None:
    for attr in ("global_scratch_size", "profile_scratch_size", "gsan_enabled"):
        launcher = CudaLauncher()
        setattr(launcher, attr, 8)
        for convention in ("flat", "packed"):
            fn, between = _direct.launch_form(launcher, "f", "p", convention)
            assert fn is launcher and between == ("f", "p", None, None, None)


@pytest.mark.parametrize(
    ("version", "convention"),
    [("3.6.0", "flat"), ("3.6.0+rocm7.2", "flat"), ("3.7.1", "packed"), ("3.8.0", "packed"),
     ("3.9.0", "packed"), ("3.5.1", None), ("3.10.0", None), ("4.0.0", None), ("", None)],
)  # fmt: skip
def test_launch_convention_by_version(version: str, convention: str | None) -> None:
    assert triton_range.launch_convention(version) == convention
    reason = triton_range.fast_launch_off_reason(version)
    assert (reason is None) == (convention is not None)
    if reason is not None:
        assert reason.startswith(f"fast launch off: Triton {version or 'unknown'} not supported")


def test_unsupported_triton_turns_the_fast_path_off_visibly(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    triton = pytest.importorskip("triton")
    pytest.importorskip("torch")
    monkeypatch.setattr(triton, "__version__", "3.5.1")
    _direct.support.cache_clear()
    observe.reset()
    try:
        with caplog.at_level("WARNING", logger="greta"):
            assert _direct.support() is None
        reason = "fast launch off: Triton 3.5.1 not supported (GRETA supports 3.6-3.9)"
        assert observe.last_implementation("fast_launch") == reason
        assert reason in caplog.text
    finally:
        _direct.support.cache_clear()


@pytest.mark.parametrize(
    ("version", "has"),
    [
        ("3.6.0", True),
        ("3.8.0", True),
        ("3.8.0+rocm7.14", True),
        ("3.9.0", False),
        ("3.10.1", False),
        ("garbage", False),
    ],
)
def test_block_pointers_end_with_triton_38(version: str, has: bool) -> None:
    assert triton_range.has_block_pointers(version) is has
