"""Broken environments for the smoke test's fault-injection tests (CPU only).

The smoke child runs isolated (`python -I`): PYTHONPATH cannot reach it, so a fault has
to live in the environment itself, as a broken install would. `fake_torch(fault)` is the
source of a `torch` package that loads the real torch (from this test interpreter's
site-packages, appended to the path after the environment's own) and breaks it:

- every fault but "crash" and "no-gpu" makes the CPU pose as the GPU (torch.accelerator
  reports one device, which computes on the CPU; Triton runs in its interpreter there);
- "wrong-matmul": float32/bfloat16 matmul and linear drop their last output row (a tile
  edge bug); "wrong-grad": their forward is exact but the weight gradient is halved
  (the gfx1033 pattern of unslothai/unsloth#8412: forward right, training wrong);
  "nan-after": float32 linear returns NaN from training step NAN_AFTER_STEPS on;
  "no-kernel": every op that makes a float32/bfloat16 tensor raises ROCm's
  "HIP error: invalid device function" (a wheel without this GPU's code);
- "crash": importing torch fails.

The smoke child keeps every CPU reference in float64 and computes on the device in
float32/bfloat16 (fp64 only for gradcheck), so "float32/bfloat16" is where the fake GPU's
faults act and the references stay right.
"""

from __future__ import annotations

import io
import site
import sys
import venv
import zipfile
from pathlib import Path

from _install_helpers import REPO

NAN_AFTER_STEPS = 12
FAULTS = ("none", "wrong-matmul", "wrong-grad", "nan-after", "no-kernel", "crash", "no-gpu")

_CRASH = "raise ImportError('libtorch_cpu.so: cannot open shared object file')\n"

_SHIM = '''"""Test stand-in: the real torch, loaded from elsewhere, with an injected fault."""
import os
import sys

_FAULT = {fault!r}
_NAN_AFTER = {nan_after!r}
_OWN = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _p in {paths!r}:
    if _p not in sys.path:
        sys.path.append(_p)  # after the environment's own packages: theirs come first
del sys.modules["torch"]
_saved = list(sys.path)
sys.path[:] = [p for p in sys.path if os.path.abspath(p) != _OWN]
try:
    import torch as _t
finally:
    sys.path[:] = _saved

_LOW = (_t.float32, _t.bfloat16)

if _FAULT != "no-gpu":
    # The CPU poses as the one GPU; Triton has no CPU backend, so it interprets there.
    os.environ["TRITON_INTERPRET"] = "1"
    _t.accelerator.is_available = lambda: True
    _t.accelerator.current_accelerator = lambda check_available=False: _t.device("cpu")
    _t.accelerator.device_count = lambda: 1

if _FAULT == "wrong-matmul":
    _matmul, _linear = _t.Tensor.__matmul__, _t.nn.functional.linear

    def _drop_last_row(out):
        if out.dtype in _LOW and out.dim() >= 2:
            keep = _t.ones_like(out)
            keep[..., -1, :] = 0
            return out * keep
        return out

    _t.Tensor.__matmul__ = lambda a, b: _drop_last_row(_matmul(a, b))
    _t.nn.functional.linear = lambda x, w, b=None: _drop_last_row(_linear(x, w, b))

if _FAULT == "wrong-grad":
    _linear = _t.nn.functional.linear

    class _HalfGrad(_t.autograd.Function):
        @staticmethod
        def forward(ctx, w):
            return w.clone()

        @staticmethod
        def backward(ctx, g):
            return g * 0.5

    def _wrong_grad_linear(x, w, b=None):
        return _linear(x, _HalfGrad.apply(w) if w.dtype in _LOW else w, b)

    _t.nn.functional.linear = _wrong_grad_linear

if _FAULT == "nan-after":
    _linear = _t.nn.functional.linear
    _calls = [0]

    def _nan_linear(x, w, b=None):
        out = _linear(x, w, b)
        if out.dtype in _LOW and _t.is_grad_enabled() and out.requires_grad:
            _calls[0] += 1
            if _calls[0] > 2 * _NAN_AFTER:  # two linear layers per step
                return out * float("nan")
        return out

    _t.nn.functional.linear = _nan_linear

if _FAULT == "no-kernel":
    from torch.overrides import TorchFunctionMode

    class _NoKernel(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {{}}))
            if isinstance(out, _t.Tensor) and out.dtype in _LOW:
                raise RuntimeError(
                    "HIP error: invalid device function\\nHIP kernel errors might be "
                    "asynchronously reported at some other API call"
                )
            return out

    _NoKernel().__enter__()  # for the rest of the process, as a missing kernel would be
'''


def real_paths(with_greta: bool = True) -> list[str]:
    """Where this test interpreter finds GRETA (this checkout, unless not with_greta) and
    torch, triton, jax. A site folder added this way has its .pth files ignored, so an
    editable install of GRETA there (README's `pip install -e`) does not bring it back."""
    paths = [str(REPO)] if with_greta else []
    paths += site.getsitepackages()
    user = site.getusersitepackages()
    if user in sys.path:
        paths.append(user)
    return paths


def fake_torch(fault: str, with_greta: bool = True) -> str:
    """Source of a torch/__init__.py carrying `fault` (one of FAULTS)."""
    assert fault in FAULTS, fault
    if fault == "crash":
        return _CRASH
    paths = real_paths(with_greta)
    return _SHIM.format(fault=fault, nan_after=NAN_AFTER_STEPS, paths=paths)


def site_packages(env_dir: Path) -> Path:
    py = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    return env_dir / "lib" / py / "site-packages"


def fault_env(
    env_dir: Path, fault: str, files: dict[str, str] | None = None, with_greta: bool = True
) -> str:
    """A venv (no pip) whose torch carries `fault`, plus `files` (path -> text) in its
    site-packages; its Python, which the smoke test runs isolated."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env_dir)
    sp = site_packages(env_dir)
    torch_init = fake_torch(fault, with_greta)
    for rel, text in {"torch/__init__.py": torch_init, **(files or {})}.items():
        path = sp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return str(env_dir / "bin" / "python")


def mirror_env(env_dir: Path) -> str:
    """A venv (no pip) that sees this interpreter's GRETA, torch, triton and jax through a
    .pth file: what an environment with GRETA installed looks like to an isolated child."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env_dir)
    pth = site_packages(env_dir) / "_greta_smoke_test_paths.pth"
    pth.write_text("\n".join(real_paths()) + "\n", encoding="utf-8")
    return str(env_dir / "bin" / "python")


def package_wheel(name: str, init: str, more: dict[str, str] | None = None) -> tuple[str, bytes]:
    """A wheel of package `name` 1.0 whose __init__.py is `init` (make_wheel's own
    __init__.py, replaced, with the RECORD to match), plus the modules in `more`."""
    from _install_helpers import _record_hash, make_wheel

    filename, data = make_wheel(name, "1.0")
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        files = {info.filename: zf.read(info) for info in zf.infolist()}
    files[f"{name}/__init__.py"] = init.encode()
    files.update({f"{name}/{rel}": text.encode() for rel, text in (more or {}).items()})
    record = next(name for name in files if name.endswith(".dist-info/RECORD"))
    files[record] = (
        "".join(
            f"{name},{_record_hash(body)},{len(body)}\n"
            for name, body in files.items()
            if name != record
        ).encode()
        + f"{record},,\n".encode()
    )
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zf:
        for name, body in files.items():
            zf.writestr(zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0)), body)
    return filename, out.getvalue()
