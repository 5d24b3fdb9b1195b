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

from greta_install.kernel_names import distribution_name, wheel_archs

ROOT = Path(__file__).resolve().parent.parent
ARCHS = wheel_archs()

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
    assert {"gfx942", "gfx1100", "gfx1201", "sm_90", "gfx90a", "gfx1103", "sm_89"} <= set(ARCHS)
    assert len(ARCHS) == len(set(ARCHS)) >= 20


@pytest.mark.parametrize("arch", ARCHS)
def test_wheel_for_arch_is_served_and_reported(served: dict, arch: str) -> None:
    row = served["status"][arch]
    assert row["distribution"] == distribution_name(arch)
    assert row["in_use"] is True and row["why_not"] == "" and row["kernels"] == 3
    assert served["hits"][arch] is True  # the JIT took the wheel's code for this arch
    doctor = served["doctor"][arch]
    fingerprint = served["fingerprint"]
    assert row["triton_fingerprint"] == fingerprint
    assert f" for {arch}, " in doctor["line"] and fingerprint[:12] in doctor["line"]
    assert doctor["line"].endswith("its code is in use")
    # Right arch, right Triton: nothing about the code itself to report.
    assert not {"kernel-wheel-arch", "kernel-wheel-triton", "kernel-wheel-broken"} & set(
        doctor["problems"]
    )
