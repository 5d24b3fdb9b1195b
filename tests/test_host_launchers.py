"""Host launchers and Triton's build key: what `greta warm` prepares so that the first
call of a kernel served from a kernel wheel runs no C compiler and hashes nothing.

On this CPU machine: the wheel describes its launchers, a launcher rebuilt from that
description generates the C source the JIT generates (CUDA and HIP), `warm` builds each
distinct source once where Triton's own lookup finds it, and the build-key memo is only
trusted while Triton's files are unchanged. On the GPU: a fresh process runs a kernel
from a warmed wheel with Triton's C compiler entry point made to fail.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from greta_core.kernel_wheels import host_launchers, triton_key_memo
from greta_install import triton_range

ROOT = Path(__file__).resolve().parent.parent


def _pythonpath(*paths: object) -> str:
    """`paths` ahead of the inherited PYTHONPATH: a stack installed with --target (the GPU
    suite's locked row) must stay importable in the child, or it runs another Triton."""
    inherited = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join([*map(str, paths), *([inherited] if inherited else [])])


def _run(code: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> dict:
    """Run `code` in a fresh interpreter (Triton's driver state must not leak) -> last JSON line."""
    full_env = {
        **os.environ,
        "TRITON_INTERPRET": "0",
        "PYTHONPATH": _pythonpath(ROOT),
        **(env or {}),
    }
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full_env,
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def fake_rocm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Triton's HIP launcher source names the libamdhip64.so it will dlopen; generating it
    # only needs the file to exist. Loading a built module needs the real one (not here).
    root = tmp_path_factory.mktemp("rocm")
    (root / "lib").mkdir()
    (root / "lib" / "libamdhip64.so").write_bytes(b"")
    return root


@pytest.fixture(scope="module")
def wheel_dir(gfx942_wheel: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """conftest's shared gfx942 kernel wheel, unpacked as pip would install it."""
    site = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(gfx942_wheel["wheel"]) as zf:
        zf.extractall(site)
    return site / "greta_kernels_gfx942"


def test_wheel_describes_every_kernels_launcher(wheel_dir: Path) -> None:
    manifest = json.loads((wheel_dir / "manifest.json").read_text())
    specs = host_launchers.wheel_specs(wheel_dir)
    assert manifest["launchers"] == sorted(specs)
    for kernel in manifest["kernels"]:
        spec = specs[kernel["launcher"]]
        assert spec["backend"] == "hip"
        assert (wheel_dir / "precompiled" / spec["entry"] / f"{spec['kernel']}.json").is_file()
        # Argument order matters to the launcher: the kernel's order, not a sorted one.
        module = importlib.import_module(f"greta_core.kernels.{kernel['module']}")
        kernel_fn = getattr(module, spec["kernel"])
        assert [name for name, _ in spec["signature"]] == list(kernel_fn.arg_names)
    # Far fewer launchers than kernels: configs and variants share a signature.
    assert 0 < len(specs) < len(manifest["kernels"])


def test_corrupt_launchers_json_is_reported(tmp_path: Path) -> None:
    (tmp_path / host_launchers.SPECS_FILE).write_text("[1, 2]")
    with pytest.raises(ValueError, match="corrupt wheel"):
        host_launchers.wheel_specs(tmp_path)
    assert host_launchers.wheel_specs(tmp_path / "missing") == {}


REBUILD_PROBE = """
import json
from greta_core.kernel_wheels import host_launchers as H
from greta_core.kernel_wheels.aot import compiling_for, discover, int_args_for, _stand_in
import tempfile
from pathlib import Path

out = {}
for arch in ("sm_90", "gfx942"):
    cache = tempfile.mkdtemp()
    with compiling_for(arch, cache):
        [found] = discover(arch, ["rms_norm"])
        spec = found.specs[0]
        fn = spec.kernel
        ints = int_args_for(spec, "ragged")
        args = [spec.constexprs[n] if n in spec.constexprs else _stand_in(n, spec.signature[n], ints)
                for n in fn.arg_names]
        fn.device_caches.clear()
        compiled = fn.warmup(*args, grid=(1,), **dict(spec.options))
    # What the JIT would build at the first launch ...
    real = H.launcher_source(compiled.src, compiled.metadata)
    # ... and what warm builds from the wheel's description and the cached metadata.
    entry = next(p for p in Path(cache).iterdir() if (p / f"{compiled.metadata.name}.json").is_file())
    described = json.loads(json.dumps(H.spec_of(compiled, entry.name)))
    metadata = H.load_metadata(entry / f"{compiled.metadata.name}.json")
    rebuilt = H.launcher_source(H._source_object(described), metadata)
    out[arch] = {"same": real == rebuilt, "length": len(real or ""), "backend": described["backend"]}
out["per_signature"] = H.per_signature_launchers()
print(json.dumps(out))
"""


def test_rebuilt_launcher_generates_the_jit_source(fake_rocm: Path) -> None:
    import triton

    out = _run(REBUILD_PROBE, {"ROCM_PATH": str(fake_rocm)})
    assert out["per_signature"] is triton_range.per_signature_launcher(triton.__version__)
    assert out["sm_90"] == {"same": True, "length": out["sm_90"]["length"], "backend": "cuda"}
    assert out["gfx942"]["same"] is True and out["gfx942"]["backend"] == "hip"
    if out["per_signature"]:  # Triton 3.6: one generated C launcher per signature
        assert out["sm_90"]["length"] > 1000 and out["gfx942"]["length"] > 1000
    else:  # 3.7+: the generic launcher serves every signature; nothing is generated
        assert out["sm_90"]["length"] == 0 and out["gfx942"]["length"] == 0


WARM_PROBE = """
import json, sysconfig, hashlib
from pathlib import Path
from greta_core.kernel_wheels import host_launchers as H, precompiled
from triton.runtime.build import platform_key
from triton.runtime.cache import get_cache_manager

pkg = Path({pkg!r})
specs = H.wheel_specs(pkg)
first = H.warm(specs.values(), pkg / "precompiled", utils=False, remember_key=False, jobs=2)
again = H.warm(specs.values(), pkg / "precompiled", utils=False, remember_key=False, jobs=2)

# Triton's own lookup, with GRETA's cache manager serving the launcher directory.
precompiled.add_root(H.launcher_dir())
suffix = sysconfig.get_config_var("EXT_SUFFIX")
found = []
for spec in specs.values():
    md = H.load_metadata(pkg / "precompiled" / spec["entry"] / (spec["kernel"] + ".json"))
    src = H.launcher_source(H._source_object(spec), md)
    if src is None:  # no per-signature launcher on this Triton: nothing to look up
        continue
    key = hashlib.sha256((src + platform_key()).encode()).hexdigest()
    path = get_cache_manager(key).get_file("__triton_launcher" + suffix)
    found.append(bool(path) and Path(path).is_relative_to(H.launcher_dir()))
print(json.dumps({{"first": first.to_json(), "again": again.to_json(), "found": found,
                  "per_signature": H.per_signature_launchers()}}))
"""


def test_warm_builds_each_distinct_launcher_once_where_triton_looks(
    wheel_dir: Path, fake_rocm: Path, tmp_path: Path
) -> None:
    out = _run(
        WARM_PROBE.format(pkg=str(wheel_dir)),
        {"ROCM_PATH": str(fake_rocm), "GRETA_CACHE_DIR": str(tmp_path)},
    )
    first, again = out["first"], out["again"]
    assert first["launchers"] == len(host_launchers.wheel_specs(wheel_dir))
    if not out["per_signature"]:  # Triton 3.7+: the generic launcher; nothing per spec
        assert first["modules"] == first["built"] == again["built"] == 0
        assert first["ok"] and first["ready"] == first["launchers"] and out["found"] == []
        return
    assert 0 < first["modules"] <= first["launchers"]
    assert first["built"] == first["modules"]  # each distinct C source compiled once
    assert again["built"] == 0  # and never again
    assert all(out["found"]) and len(out["found"]) == first["launchers"]
    # The built modules cannot be loaded without a real HIP runtime: said, not hidden.
    assert first["ok"] is False and first["failed"]
    assert all("libamdhip64" in line for line in first["failed"])


def test_doctor_wants_warm_until_it_ran(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from greta_core.kernel_wheels.installed import KernelWheelInfo, check_kernel_wheel

    monkeypatch.setenv("GRETA_CACHE_DIR", str(tmp_path))
    manifest = {"arch": "sm_90", "triton_version": "3.6.0", "package": "greta_kernels_sm_90",
                "launchers": ["a" * 64, "b" * 64]}  # fmt: skip
    wheel = KernelWheelInfo("sm_90", "greta-kernels-sm-90", "0.1.0", tmp_path, manifest)
    [problem] = check_kernel_wheel("sm_90", "3.6.0", [wheel])
    assert problem.id == "kernel-wheel-launchers" and problem.fix == "greta warm"
    report = host_launchers.WarmReport("cuda", str(tmp_path), launchers=2, modules=1, ready=2)
    host_launchers.write_stamp(manifest, report)
    assert check_kernel_wheel("sm_90", "3.6.0", [wheel]) == []
    # Another wheel build (other launchers) is not covered by that stamp.
    other = {**manifest, "launchers": ["c" * 64]}
    assert not host_launchers.is_warm(other)
    # A failed warm leaves the problem in place.
    host_launchers.write_stamp(other, host_launchers.WarmReport("cuda", "", failed=["x: boom"]))
    assert not host_launchers.is_warm(other)


# --- Triton's build key --------------------------------------------------------------------


def _fake_triton(root: Path) -> Path:
    for rel in ("runtime/cache.py", "compiler/compiler.py", "backends/nvidia/driver.py",
                "_C/libtriton.so"):  # fmt: skip
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rel.encode())
    return root


def test_key_memo_is_dropped_when_triton_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import triton.runtime.cache as cache

    root = _fake_triton(tmp_path / "triton")
    memo = tmp_path / "memo.json"
    value = triton_key_memo.remember(memo, root)
    assert value == cache.triton_key()
    assert triton_key_memo.lookup(memo, root) == value
    lib = root / "_C" / "libtriton.so"
    lib.write_bytes(b"a rebuilt libtriton")  # size and mtime change
    assert triton_key_memo.lookup(memo, root) is None
    triton_key_memo.remember(memo, root)
    os.utime(root / "backends" / "nvidia" / "driver.py", ns=(1, 1))  # mtime only
    assert triton_key_memo.lookup(memo, root) is None
    (root / "backends" / "amd").mkdir()
    triton_key_memo.remember(memo, root)
    (root / "backends" / "amd" / "new.py").write_text("")  # a new file Triton would hash
    assert triton_key_memo.lookup(memo, root) is None
    memo.write_text("{not json")
    assert triton_key_memo.lookup(memo, root) is None


SEED_PROBE = """
import json, time
from pathlib import Path
from greta_core.kernel_wheels import triton_key_memo
import triton.runtime.cache as cache
memo = Path({memo!r})
seeded = triton_key_memo.seed(memo)
t = time.perf_counter()
value = cache.triton_key()
print(json.dumps({{"seeded": seeded, "value": value, "seconds": time.perf_counter() - t,
                   "marked": getattr(cache.triton_key, "greta_seeded", False),
                   "again": triton_key_memo.seed(memo)}}))
"""


def test_seed_hands_triton_the_remembered_key(tmp_path: Path) -> None:
    import triton.runtime.cache as cache

    memo = tmp_path / "memo.json"
    triton_key_memo.remember(memo)
    out = _run(SEED_PROBE.format(memo=str(memo)))
    assert out["seeded"] is True and out["marked"] is True and out["again"] is True
    assert out["value"] == cache.triton_key()  # the value Triton computes itself
    # A memo from another Triton build: not used, Triton hashes as usual.
    memo.write_text(json.dumps({"0" * 64: "someone-elses-key"}))
    out = _run(SEED_PROBE.format(memo=str(memo)))
    assert out["seeded"] is False and out["marked"] is False
    assert out["value"] == cache.triton_key()


def test_seed_never_replaces_a_key_triton_computed(tmp_path: Path) -> None:
    memo = tmp_path / "memo.json"
    triton_key_memo.remember(memo)
    out = _run(
        "import json, triton.runtime.cache as c; c.triton_key()\n"
        "from greta_core.kernel_wheels import triton_key_memo as m; from pathlib import Path\n"
        f"print(json.dumps({{'seeded': m.seed(Path({str(memo)!r}))}}))"
    )
    assert out == {"seeded": False}


# --- the whole path on a GPU -------------------------------------------------------------

GPU_PROBE = """
import json, time
import torch
import triton.runtime.build as build
def no_compiler(name, *args, **kwargs):
    raise AssertionError(f"the C compiler ran for {{name}}")
build._build = no_compiler
import triton.runtime.cache as cache
from greta_core import raw
from greta_core.kernel_wheels import precompiled
x = torch.randn(65536, device="cuda", dtype=torch.float16)
torch.cuda.synchronize()
t = time.perf_counter()
y = raw.vec_add(x, x)
torch.cuda.synchronize()
print(json.dumps({{"active": precompiled.activate(), "seconds": time.perf_counter() - t,
                   "correct": bool(torch.equal(y, x + x)),
                   "key_seeded": getattr(cache.triton_key, "greta_seeded", False)}}))
"""


@pytest.mark.gpu
def test_warmed_wheel_first_call_runs_no_compiler(tmp_path: Path) -> None:
    from greta_core.arch import device_arch
    from greta_core.commands.build_kernels import build_all

    arch = device_arch()
    [outcome] = build_all([arch], tmp_path / "wheels", only=["vec_add"], jobs=1)
    assert "fatal" not in outcome, outcome
    site = tmp_path / "site"
    with zipfile.ZipFile(outcome["wheel"]) as zf:
        zf.extractall(site)
    env = {
        **os.environ,
        "TRITON_INTERPRET": "0",
        "PYTHONPATH": _pythonpath(ROOT, site),
        "GRETA_CACHE_DIR": str(tmp_path / "greta-cache"),
    }
    warm = subprocess.run(
        [sys.executable, "-m", "greta", "warm", "--json"], env=env, capture_output=True, text=True
    )
    assert warm.returncode == 0, warm.stdout + warm.stderr
    [row] = json.loads(warm.stdout)
    assert row["ok"] and row["ready"] == row["launchers"] > 0 and row["utils"] == "ready"
    env["TRITON_CACHE_DIR"] = str(tmp_path / "empty-triton-cache")
    out = _run(GPU_PROBE.format(), env)
    assert out == {**out, "active": True, "correct": True, "key_seeded": True}


# --- the installer's step --------------------------------------------------------------


class _WarmContext:
    """What WarmLaunchers uses of the pipeline's CommitContext, for one environment."""

    def __init__(self, python: str) -> None:
        from types import SimpleNamespace

        self.executable = python
        self.lines: list[str] = []
        self.results: dict[str, object] = {}
        # The build step did not run here: no kernel wheel of this run to vouch for.
        self.plan = SimpleNamespace(kernel_wheel=SimpleNamespace(arch="gfx942", status="build"))

    def log(self, line: str) -> None:
        self.lines.append(line)

    def python(self, args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.executable, "-I", *args], capture_output=True, text=True, timeout=timeout,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip


def test_install_step_runs_warm_and_only_warns_when_it_cannot(tmp_path: Path) -> None:
    from greta_install.install.pipeline import StepFailed
    from greta_install.install.steps import WarmLaunchers

    step = WarmLaunchers()
    assert step.required is False  # a failure is a warning, never an undone install
    assert step.argv("py") == ["py", "-I", "-m", "greta", "warm"]
    # An environment without greta: the step fails with the command to retry.
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    ctx = _WarmContext(str(bare / "bin" / "python"))
    with pytest.raises(StepFailed, match="greta warm failed") as failed:
        step.run(ctx)  # type: ignore[arg-type]
    assert f"{ctx.executable} -m greta warm" in str(failed.value)
    assert ctx.results["warm"] is False


# --- `greta warm` on what it finds installed ----------------------------------------------


def _warm_cli(site: Path, cache: Path) -> tuple[int, list[dict]]:
    # No ROCm on this machine (and no fake one: loading an empty libamdhip64.so crashes).
    env = {**os.environ, "TRITON_INTERPRET": "0", "GRETA_CACHE_DIR": str(cache),
           "PYTHONPATH": _pythonpath(ROOT, site)}  # fmt: skip
    env.pop("ROCM_PATH", None)
    out = subprocess.run(
        [sys.executable, "-m", "greta", "warm", "--json"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    return out.returncode, json.loads(out.stdout)


def test_warm_cli_reports_each_wheel_and_never_stamps_a_failure(
    wheel_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    import triton

    from greta_install.environment.wheelfiles import record_digest

    def install(name: str, changes: dict[str, bytes]) -> Path:
        """The wheel as pip leaves it, with `changes` (package file -> bytes) made as another
        build would have them: RECORD agrees (greta warm verifies the installed files)."""
        site = tmp_path / name
        shutil.copytree(wheel_dir, site / wheel_dir.name)
        # ... with its dist-info: package files without one are not an installed wheel.
        for info in wheel_dir.parent.glob("greta_kernels_gfx942-*.dist-info"):
            shutil.copytree(info, site / info.name)
            record = site / info.name / "RECORD"
            rows = record.read_text().splitlines()
            for rel, data in changes.items():
                member = f"{wheel_dir.name}/{rel}"
                (site / member).write_bytes(data)
                row = f"{member},{record_digest(data)},{len(data)}"
                rows = [row if r.startswith(f"{member},") else r for r in rows]
            record.write_text("\n".join(rows) + "\n")
        return site

    site = install("site", {})
    package = site / wheel_dir.name
    manifest = json.loads((package / "manifest.json").read_text())

    # No HIP runtime here: neither the driver helpers nor the launchers (whose source names
    # libamdhip64.so) can be made, so warm fails and says why.
    rc, [row] = _warm_cli(site, tmp_path / "cache")
    assert rc == 1 and row["ok"] is False and row["utils"].startswith("failed")
    assert row["ready"] == 0
    if host_launchers.per_signature_launchers():
        assert row["failed"] and all("libamdhip64" in line for line in row["failed"])
    else:  # 3.7+: only the helpers (with the generic launcher) are built, and they failed
        assert row["failed"] == []
    assert row["package"] == "greta_kernels_gfx942" and row["launchers"] == len(
        manifest["launchers"]
    )
    monkeypatch.setenv("GRETA_CACHE_DIR", str(tmp_path / "cache"))
    assert not host_launchers.is_warm(manifest)  # no stamp for a failed warm

    # A wheel for another Triton: its code is not used, so there is nothing to build.
    other = json.dumps({**manifest, "triton_version": "0.0.1"}).encode()
    rc, [row] = _warm_cli(install("site2", {"manifest.json": other}), tmp_path / "cache2")
    assert rc == 0 and "0.0.1" in row["skipped"] and triton.__version__ in row["skipped"]

    # A corrupt launcher description is an error naming the file, not a traceback.
    corrupt = {host_launchers.SPECS_FILE: b'{"x": 1}'}
    rc, [row] = _warm_cli(install("site3", corrupt), tmp_path / "cache3")
    assert rc == 1 and "launchers.json" in row["error"] and "corrupt" in row["error"]

    # The same file changed after the install (RECORD not): refused before it is read.
    (package / host_launchers.SPECS_FILE).write_text('{"x": 1}')
    rc, [row] = _warm_cli(site, tmp_path / "cache4")
    assert rc == 1 and row["error"].startswith("not warmed: the installed wheel is refused")
