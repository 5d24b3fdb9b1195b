"""Prototype: GRETA's vec_add as a PyTorch operator, torch.ops.greta.vec_add.

    python compat/pytorch/greta_extension_hello.py

Checks the CPU kernel (torch reference code, or the real Triton kernel under
TRITON_INTERPRET=1) and, where a GPU is visible, the GPU path (the Triton kernel through
torch.library.triton_op); both against a float64 reference and through autograd. Prints
which implementation ran (greta_core.observe.last_implementation).

Last line: STATUS=OK (GPU path checked), STATUS=FALLBACK reason=... (no GPU: only the CPU
kernel could run), or STATUS=FAIL reason=... (exit code 1).
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def finish(status: str, reason: str = "") -> int:
    print(f"STATUS={status}" + (f" reason={reason}" if reason else ""))
    return 1 if status == "FAIL" else 0


def check(device: str) -> str:
    """Run the op forward and backward on `device`; return the implementation that ran."""
    import torch

    from greta_core import observe

    x = torch.randn(1000, device=device, requires_grad=True)
    y = torch.randn(1000, device=device, requires_grad=True)
    out = torch.ops.greta.vec_add(x, y)
    ran = observe.last_implementation("vec_add") or "unknown"
    ref = x.detach().double() + y.detach().double()
    err = float((out.detach().double() - ref).abs().max())
    if torch.isnan(out).any() or err > 1e-6:
        raise AssertionError(f"{device}: wrong result, max|err|={err:.2e}")
    grad = torch.randn_like(out)
    out.backward(grad)
    if not (torch.equal(x.grad, grad) and torch.equal(y.grad, grad)):
        raise AssertionError(f"{device}: wrong gradient")
    print(f"  {device}: result ok (max|err|={err:.1e}), autograd ok, implementation={ran}")
    return ran


def main() -> int:
    try:
        import torch
    except ImportError as exc:
        return finish("FAIL", f"torch not importable: {exc}")
    try:
        import greta_core
    except ImportError:
        sys.path.insert(0, str(REPO))  # running from a checkout without installing
    try:
        import greta_core.torch  # noqa: F401  (registers torch.ops.greta.*)
    except Exception as exc:
        return finish("FAIL", f"cannot register the GRETA ops: {exc.__class__.__name__}: {exc}")
    print(f"torch {torch.__version__}; torch.ops.greta.vec_add = {torch.ops.greta.vec_add}")
    try:
        cpu_ran = check("cpu")
        if not torch.cuda.is_available():
            return finish(
                "FALLBACK", f"no GPU visible to torch: only the CPU kernel ran ({cpu_ran})"
            )
        gpu_ran = check("cuda")
    except AssertionError as exc:
        return finish("FAIL", str(exc))
    except Exception as exc:
        return finish("FAIL", f"{exc.__class__.__name__}: {exc}".splitlines()[0])
    if gpu_ran != "triton":
        return finish("FAIL", f"GPU call ran {gpu_ran!r}, not the Triton kernel")
    print(f"GPU path: the GRETA Triton kernel on {torch.cuda.get_device_name(0)}")
    return finish("OK")


if __name__ == "__main__":
    sys.exit(main())
