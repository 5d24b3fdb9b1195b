"""GRETA kernel wheels: build the gfx942 wheel here, install it into a fresh environment,
check what it holds, and prove Triton's JIT takes its precompiled code (cache hit, no
compile) for the specialisations it covers, and compiles the ones it does not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from conftest import SHARED_WHEEL_ARCH, SHARED_WHEEL_KERNELS, SHARED_WHEEL_VEC_ADD_BLOCK

from greta_core.kernel_wheels.installed import KernelWheelInfo, check_kernel_wheel
from greta_core.kernel_wheels.wheelbuild import (
    distribution_name,
    package_name,
    verify_record,
    wheel_filename,
)

ROOT = Path(__file__).resolve().parent.parent
ARCH = SHARED_WHEEL_ARCH
TUNED_BLOCK = SHARED_WHEEL_VEC_ADD_BLOCK


def _pythonpath(*paths: object) -> str:
    """`paths` ahead of the inherited PYTHONPATH: a stack installed with --target (the GPU
    suite's locked row) must stay importable in the child, or it runs another Triton."""
    inherited = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join([*map(str, paths), *([inherited] if inherited else [])])


@pytest.fixture(scope="module")
def built(gfx942_wheel: dict) -> dict:
    """conftest's shared gfx942 wheel (vec_add + col_sum, vec_add's BLOCK set to 512)."""
    return gfx942_wheel


@pytest.fixture(scope="module")
def venv(built: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh environment (no system site-packages) with only the kernel wheel in it."""
    env_dir = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
         "--no-deps", "--no-index", built["wheel"]],
        check=True,
    )  # fmt: skip
    return env_dir


def _site_packages(env_dir: Path) -> Path:
    out = subprocess.run(
        [str(env_dir / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return Path(out.stdout.strip())


def test_names_carry_the_arch() -> None:
    assert distribution_name("sm_90") == "greta-kernels-sm-90"
    assert package_name("sm_90") == "greta_kernels_sm_90"
    assert wheel_filename("sm_90", "0.1.0") == "greta_kernels_sm_90-0.1.0-py3-none-any.whl"
    assert distribution_name("gfx1201") == "greta-kernels-gfx1201"


def test_wheel_record_and_manifest(built: dict) -> None:
    wheel = Path(built["wheel"])
    assert wheel.name.startswith("greta_kernels_gfx942-")
    assert verify_record(wheel) == []
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        manifest = json.loads(zf.read("greta_kernels_gfx942/manifest.json"))
        metadata = zf.read("greta_kernels_gfx942-0.1.0.dist-info/METADATA").decode()
    assert "Name: greta-kernels-gfx942" in metadata
    import triton

    assert manifest["arch"] == ARCH
    assert manifest["distribution"] == "greta-kernels-gfx942"
    assert manifest["triton_version"] == triton.__version__
    assert len(manifest["triton_fingerprint"]) == 32
    assert len(manifest["source_hash"]) == 64
    assert manifest["build_date"].endswith("Z")
    specs = {(k["spec"], k["variant"]) for k in manifest["kernels"]}
    # Derived specs are named kernel[pointer dtypes;constexprs] (ops/declare.py).
    vec_add = {(s.partition(";")[0], v) for s, v in specs if s.startswith("vec_add_kernel[")}
    assert vec_add == {
        (f"vec_add_kernel[{d},{d},{d}", v)
        for d in ("fp32", "fp16", "bf16")
        for v in ("aligned", "ragged")
    }
    assert len([s for s, _ in specs if s.startswith("vec_add_kernel[")]) == 6
    assert {k["module"] for k in manifest["kernels"]} == set(SHARED_WHEEL_KERNELS)
    assert len(manifest["kernels"]) == built["compiled"]
    for kernel in manifest["kernels"]:
        if kernel["module"] != "vec_add":
            continue
        prefix = f"greta_kernels_gfx942/precompiled/{kernel['dir']}/"
        assert prefix + "vec_add_kernel.hsaco" in names
        assert prefix + "__grp__vec_add_kernel.json" in names
        # aligned: n divisible by 16 -> tt.divisibility; ragged: not.
        assert ("n_elements" in kernel["specialised"]) == (kernel["variant"] == "aligned")


def test_record_tampering_is_detected(built: dict, tmp_path: Path) -> None:
    src = Path(built["wheel"])
    bad = tmp_path / src.name
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(bad, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item)
            if item.filename.endswith("configs.json"):
                data = data.replace(b"512", b"256")
            zout.writestr(item, data)
    assert any("configs.json" in p for p in verify_record(bad))


def test_installed_wheel_contents(venv: Path) -> None:
    site = _site_packages(venv)
    pkg = site / "greta_kernels_gfx942"
    assert (pkg / "manifest.json").is_file()
    table = json.loads((pkg / "configs.json").read_text())
    assert table["ops"]["vec_add"]["default"]["BLOCK"] == TUNED_BLOCK
    hsaco = list((pkg / "precompiled").glob("*/vec_add_kernel.hsaco"))
    assert len(hsaco) == 6
    dist = site / "greta_kernels_gfx942-0.1.0.dist-info"
    assert (dist / "RECORD").is_file()


def test_configs_lookup_prefers_the_wheel_table(venv: Path) -> None:
    code = (
        "from greta_core import configs;"
        "print(configs.lookup('vec_add', 'gfx942')['BLOCK'], configs.lookup('vec_add', 'gfx1100')['BLOCK'])"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    from greta_core.configs import shipped_table

    shipped_1100 = json.loads(shipped_table("gfx1100"))["ops"]["vec_add"]["default"]["BLOCK"]
    assert out.stdout.split() == [str(TUNED_BLOCK), str(shipped_1100)]


JIT_PROBE = """
import json, sys, tempfile
import triton.language as tl
from triton import knobs
from triton.runtime.driver import driver
from triton.runtime.jit import MockTensor
from greta_core import observe
from greta_core.kernel_wheels import precompiled
from greta_core.kernel_wheels.aot import _TargetDriver, target_for
from greta_core.kernels.vec_add import vec_add_kernel

knobs.cache.dir = tempfile.mkdtemp()  # empty: a hit can only come from the wheel
driver.set_active(_TargetDriver(target_for("gfx942")))
events = []
knobs.compilation.listener = lambda **kw: events.append(kw["cache_hit"])
active = precompiled.activate()

def call(n, block):
    t = MockTensor(tl.float16)
    vec_add_kernel.warmup(t, t, n, t, BLOCK=block, num_warps=8, grid=(1,))
    return events.pop()

print(json.dumps({{
    "active": active,
    "aligned": call(4096, {tuned}), "ragged": call(1000, {tuned}),
    "shipped_block": call(4096, {shipped}), "other_block": call(4096, 128),
    "code": observe.kernel_code_counts(),
}}))
"""


def test_jit_takes_the_precompiled_code(venv: Path, tmp_path: Path) -> None:
    # The dev environment's triton + this repository + the freshly installed wheel.
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    env["PYTHONPATH"] = _pythonpath(ROOT, _site_packages(venv))
    from greta_core.configs import shipped_table

    shipped = json.loads(shipped_table(ARCH))["ops"]["vec_add"]["default"]["BLOCK"]
    assert shipped != TUNED_BLOCK
    (tmp_path / "probe.py").write_text(JIT_PROBE.format(tuned=TUNED_BLOCK, shipped=shipped))
    out = subprocess.run(
        [sys.executable, str(tmp_path / "probe.py")],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["active"] is True
    # Built in another process, looked up by the JIT here: same keys.
    assert result["aligned"] is True
    assert result["ragged"] is True
    # The wheel holds exactly the blocks its own (tuned) table can request: not the
    # shipped table's, not any other; those compile as usual.
    assert result["shipped_block"] is False
    assert result["other_block"] is False
    # The fallback is visible: two specialisations served by the wheel, two compiled.
    assert result["code"] == {"vec_add_kernel": {"precompiled": 2, "compiled": 2}}


def test_purelib_is_where_pip_put_it(venv: Path) -> None:
    # Guard for the tests above: they must not see the dev environment's packages.
    assert _site_packages(venv) != Path(sysconfig.get_paths()["purelib"])


def _wheel(arch: str, triton: str = "3.6.0") -> KernelWheelInfo:
    return KernelWheelInfo(
        arch, f"greta-kernels-{arch}", "0.1.0", Path("x"), {"arch": arch, "triton_version": triton}
    )


def test_doctor_checks() -> None:
    assert check_kernel_wheel(None, "3.6.0", []) == []  # no GPU: nothing to say
    [missing] = check_kernel_wheel("gfx942", "3.6.0", [])
    assert missing.id == "kernel-wheel-missing" and "greta install" in missing.fix
    [wrong] = check_kernel_wheel("gfx1100", "3.6.0", [_wheel("gfx942")])
    assert wrong.id == "kernel-wheel-arch" and "greta-kernels-gfx942" in wrong.fix
    [old] = check_kernel_wheel("sm_90", "3.7.0", [_wheel("sm_90", "3.6.0")])
    assert old.id == "kernel-wheel-triton" and "build-kernels --arch sm_90" in old.fix
    assert check_kernel_wheel("sm_90", "3.6.0", [_wheel("sm_90")]) == []


def test_installed_kernel_wheel_reads_the_install(venv: Path, built: dict) -> None:
    code = (
        "from greta_core.kernel_wheels.installed import installed_kernel_wheel as f; w = f();"
        "print(w.arch, w.distribution, w.version, w.kernel_count)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    assert out.stdout.split() == ["gfx942", "greta-kernels-gfx942", "0.1.0", str(built["compiled"])]
