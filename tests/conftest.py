"""Shared test fixtures.

GPU tests carry `@pytest.mark.gpu`; they are skipped with a reason on a machine whose
torch sees no GPU, and really run on the lent H100 (`pytest -m gpu`).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

try:  # the fuzz tests' examples are the same on every run (reproducible failures)
    from hypothesis import settings

    settings.register_profile("greta", derandomize=True, print_blob=True)
    settings.load_profile("greta")
except ImportError:
    pass


def _has_nvidia_or_amd_gpu() -> bool:
    # Cheap check before torch is imported: the interpreter flag must be set before
    # any Triton kernel is defined (triton.jit reads it at decoration time).
    return any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/kfd")) or bool(
        shutil.which("nvidia-smi")
    )


if not _has_nvidia_or_amd_gpu():
    # No GPU: the kernel tests run the real Triton kernels through Triton's interpreter.
    os.environ.setdefault("TRITON_INTERPRET", "1")
    # ... and the torch ops' CPU kernels run those Triton kernels too (not the reference).
    os.environ.setdefault("GRETA_TRITON_ON_CPU", "1")

DATA = Path(__file__).parent / "data"
# GRETA_TEST_SEED varies the inputs of every seeded test (scripts/repeat_tests.sh).
SEED = int(os.environ.get("GRETA_TEST_SEED", "0"))


@pytest.fixture(autouse=True)
def _seeded_rngs() -> None:
    """Every test starts from the same random state: Python's, NumPy's global one and
    torch's (CPU and every GPU), whichever of them the test's modules imported."""
    random.seed(SEED)
    if (np := sys.modules.get("numpy")) is not None:
        np.random.seed(SEED)
    if (torch := sys.modules.get("torch")) is not None:
        torch.manual_seed(SEED)  # seeds the CUDA/ROCm generators too


@pytest.fixture(autouse=True)
def _no_patch_left_behind():
    """A test that patches a model family with apply_greta reverts it: under --dist worksteal
    the next test on the worker would otherwise start from GRETA's functions, not
    transformers'. The leak fails the test that left it, and is undone for the next one."""
    yield
    if (apply := sys.modules.get("greta_core.transformers.apply")) is None:
        return
    left = apply.patched_targets()
    if not left:
        return
    from greta_core.transformers import revert_greta

    for key in left:
        revert_greta(key)
    pytest.fail(f"apply_greta patches left behind: {left!r}", pytrace=False)


SNAPSHOTS = DATA / "snapshots"


@pytest.fixture
def greta_training():
    """Kernel tests test GRETA's kernels in training too, whatever size the tables hand to
    torch's op (each declared ``training_route``'s ``<op>_training`` entry)."""
    import greta_core.raw  # noqa: F401  (every op declared)
    from greta_core import configs
    from greta_core.ops.declare import DECLARED

    pinned = {
        op.training_entry: {"backend": "greta"} for op in DECLARED.values() if op.training_route
    }
    with configs.Override(pinned):
        yield


def snapshot_names() -> list[str]:
    return sorted(p.name for p in SNAPSHOTS.iterdir() if (p / "expected.json").is_file())


def load_expected(name: str) -> dict:
    return json.loads((SNAPSHOTS / name / "expected.json").read_text())


def _gpu_available() -> tuple[bool, str]:
    try:
        import torch
    except Exception as exc:  # torch absent or broken: no GPU tests
        return False, f"torch not importable ({exc.__class__.__name__})"
    if not torch.cuda.is_available():
        return False, "no CUDA/ROCm GPU visible to torch"
    return True, ""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    ok, why = _gpu_available()
    if ok:
        return
    skip = pytest.mark.skip(reason=f"GPU test: {why}")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


# --- one small gfx942 kernel wheel per test session ----------------------------------------

# Two kernels with different launcher signatures, both variants: enough for the AOT report,
# the wheel's RECORD/manifest/config checks and the host-launcher descriptions, and built
# in seconds (the whole-library AOT run is the `slow` test in test_aot.py).
SHARED_WHEEL_ARCH = "gfx942"
SHARED_WHEEL_KERNELS = ("vec_add", "col_sum")
# The shipped table with vec_add's block changed, so "the wheel's table won" is observable.
SHARED_WHEEL_VEC_ADD_BLOCK = 512


def build_shared_wheel(out: Path, jobs: int, progress: Any = None) -> dict:
    """`build_all`'s outcome for the shared wheel's arch, kernels and table, into `out`."""
    from greta_core.commands.build_kernels import build_all
    from greta_core.configs import shipped_table

    table = json.loads(shipped_table(SHARED_WHEEL_ARCH))
    table["ops"]["vec_add"]["default"]["BLOCK"] = SHARED_WHEEL_VEC_ADD_BLOCK
    [outcome] = build_all(
        [SHARED_WHEEL_ARCH], out, only=list(SHARED_WHEEL_KERNELS),
        configs_text=json.dumps(table), jobs=jobs, progress=progress,
    )  # fmt: skip
    assert "fatal" not in outcome, outcome
    return outcome


@pytest.fixture(scope="session")
def gfx942_wheel(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Build outcome of the shared gfx942 wheel (`build_all`'s dict: wheel, results, ...).

    Built once per session: under xdist the workers share the run's base folder and take a
    file lock, so one builds and the others read its outcome."""
    import fcntl

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # this run's folder, shared by its workers only
    out = base / "shared-gfx942-wheel"
    outcome_file = out / "outcome.json"
    out.mkdir(exist_ok=True)
    with (base / "shared-gfx942-wheel.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not outcome_file.is_file():
            outcome_file.write_text(json.dumps(build_shared_wheel(out, jobs=1)))
    return json.loads(outcome_file.read_text())
