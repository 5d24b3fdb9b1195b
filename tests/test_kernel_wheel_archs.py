"""A kernel wheel for every arch of the matrix is served by the runtime and named by the doctor.

One build compiles a tiny wheel (vec_add, aligned ints) for each arch ``greta install`` can
build a wheel for (``greta_install.kernel_names.wheel_archs``: every target's archs in the
version matrix), installs all of them into one folder, and a fresh interpreter reports, per
arch: the runtime's view (``precompiled.status``: its code in use), a JIT call for that arch
served from the wheel (cache hit, no compile), and the doctor's line (arch, Triton
fingerprint, code in use).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import triton

from greta_install.archs import triton_cannot_target
from greta_install.kernel_names import distribution_name, wheel_archs

ROOT = Path(__file__).resolve().parent.parent
# Every matrix arch the installed Triton can compile for (Triton 3.9 dropped RDNA1/RDNA2,
# whose rows pin an older Triton: test_build_refuses_archs_this_triton_cannot_target).
ARCHS = [a for a in wheel_archs() if not triton_cannot_target(a, triton.__version__)]

PROBE = """
import json, sys, tempfile
import triton, triton.language as tl
from triton import knobs
from triton.runtime.driver import driver
from triton.runtime.jit import MockTensor
from greta_core import configs
from greta_core.kernel_wheels import precompiled
from greta_core.kernel_wheels.aot import _TargetDriver, target_for, triton_fingerprint
from greta_core.kernel_wheels.installed import check_kernel_wheel, describe, installed_kernel_wheels
from greta_core.kernels.vec_add import vec_add_kernel

status = {row["arch"]: row for row in precompiled.status()}
events = []
knobs.compilation.listener = lambda **kw: events.append(kw["cache_hit"])
hits = {}
for arch in json.loads(sys.argv[1]):
    knobs.cache.dir = tempfile.mkdtemp()  # empty: a hit can only come from the wheel
    driver.set_active(_TargetDriver(target_for(arch)))
    vec_add_kernel.device_caches.clear()
    config = configs.lookup("vec_add", arch)
    t = MockTensor(tl.float16)
    vec_add_kernel.warmup(t, t, 4096, t, BLOCK=config["BLOCK"], grid=(1,),
                          **configs.launch_options(config, arch))
    hits[arch] = events.pop()
doctor = {
    w.arch: {"line": describe(w, triton.__version__),
             "problems": [p.id for p in check_kernel_wheel(w.arch, triton.__version__, [w])]}
    for w in installed_kernel_wheels()
}
print(json.dumps({"status": status, "hits": hits, "doctor": doctor,
                  "fingerprint": triton_fingerprint()}))
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict:
    from greta_core.commands.build_kernels import build_all

    out = tmp_path_factory.mktemp("arch-wheels")
    outcomes = build_all(list(ARCHS), out, only=["vec_add"], variants=["aligned"], jobs=2)
    site = tmp_path_factory.mktemp("site")
    for outcome in outcomes:
        assert "fatal" not in outcome, outcome
        with zipfile.ZipFile(outcome["wheel"]) as zf:
            zf.extractall(site)  # what pip puts in site-packages: package + dist-info
    inherited = os.environ.get("PYTHONPATH", "")
    env = {
        **os.environ,
        "TRITON_INTERPRET": "0",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(site), *([inherited] if inherited else [])]),
    }
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(list(ARCHS))],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_matrix_arch_is_a_wheel_arch() -> None:
    # The tuned four and the rest of the matrix (gfx90a, gfx1103, gfx1151, sm_89, ...).
    every = wheel_archs()
    assert {"gfx942", "gfx1100", "gfx1201", "sm_90", "gfx90a", "gfx1103", "sm_89"} <= set(ARCHS)
    assert len(every) == len(set(every)) >= 30 and len(ARCHS) >= 20


@pytest.mark.parametrize(
    ("version", "refused"),
    [
        ("3.8.0", set()),
        (
            "3.9.0",
            {
                "gfx1010",
                "gfx1011",
                "gfx1012",
                "gfx1030",
                "gfx1031",
                "gfx1032",
                "gfx1033",
                "gfx1034",
                "gfx1035",
                "gfx1036",
            },
        ),
    ],
)
def test_build_refuses_archs_this_triton_cannot_target(
    version: str, refused: set[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An arch the installed Triton's compiler dropped gets one clear reason and no compile
    (Triton 3.9 fails every gfx10 kernel in its pass pipeline); the others still build."""
    from greta_core.commands.build_kernels import build_all

    monkeypatch.setattr(triton, "__version__", version)
    gone = {a for a in wheel_archs() if triton_cannot_target(a, version)}
    assert gone == refused
    if not refused:
        return
    (outcome,) = build_all(["gfx1030"], tmp_path, only=["vec_add"], variants=["aligned"], jobs=1)
    assert outcome["fatal"].startswith(f"Triton {version} cannot compile for gfx1030 (RDNA2")
    assert "radeon rows pin Triton 3.8 or older" in outcome["fatal"]
    assert "compiled" not in outcome and not list(tmp_path.iterdir())


def test_wheel_for_every_arch_is_served_and_reported(served: dict) -> None:
    # One test over every arch, not one per arch: under xdist each worker that ran one of
    # them built the module's `served` fixture again (a minute of compiles each).
    fingerprint = served["fingerprint"]
    assert set(served["status"]) >= set(ARCHS) and set(served["hits"]) == set(ARCHS)
    for arch in ARCHS:
        row = served["status"][arch]
        assert row["distribution"] == distribution_name(arch), arch
        assert row["in_use"] is True and row["why_not"] == "" and row["kernels"] == 3, row
        assert served["hits"][arch] is True, arch  # the JIT took the wheel's code for it
        doctor = served["doctor"][arch]
        assert row["triton_fingerprint"] == fingerprint, arch
        assert f" for {arch}, " in doctor["line"] and fingerprint[:12] in doctor["line"], arch
        assert doctor["line"].endswith("its code is in use"), doctor["line"]
        # Right arch, right Triton: nothing about the code itself to report.
        found = {"kernel-wheel-arch", "kernel-wheel-triton", "kernel-wheel-broken"}
        assert not found & set(doctor["problems"]), (arch, doctor["problems"])
