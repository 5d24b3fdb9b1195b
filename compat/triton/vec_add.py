"""Prototype: GRETA's vec_add Triton kernel, launched raw, checked against torch.

    python compat/triton/vec_add.py

On a GPU the kernel is compiled and launched there. On a machine without one this script
sets TRITON_INTERPRET=1 itself (before triton is imported) so the SAME kernel runs under
Triton's CPU interpreter. That counts as STATUS=OK: the kernel code, its launch grid and
its config-table lookup all ran and were checked; only the code generator did not. The
output says which happened ("ran on <gpu>" or "ran under TRITON_INTERPRET=1").

Last line: STATUS=OK, or STATUS=FAIL reason=... (exit code 1).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def finish(status: str, reason: str = "") -> int:
    print(f"STATUS={status}" + (f" reason={reason}" if reason else ""))
    return 1 if status == "FAIL" else 0


def main() -> int:
    try:
        import torch
    except ImportError as exc:
        return finish("FAIL", f"torch not importable: {exc}")
    # Decide before triton is imported: triton.jit reads TRITON_INTERPRET at decoration time.
    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        import greta_core  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(REPO))  # running from a checkout without installing
    try:
        import triton

        from greta_core.arch import arch_of
        from greta_core.ops._plan import run
        from greta_core.ops.declare import Meta
        from greta_core.ops.vec_add import plan
    except Exception as exc:
        return finish("FAIL", f"cannot import the kernel: {exc.__class__.__name__}: {exc}")

    device = "cuda" if on_gpu else "cpu"
    where = torch.cuda.get_device_name(0) if on_gpu else "CPU"
    print(f"torch {torch.__version__}, triton {triton.__version__}, device {where}")
    failures = []
    for dtype in (torch.float32, torch.float16):
        for n in (1, 1000, 4099):  # ragged tails: not multiples of the block
            x = torch.randn(n, device=device, dtype=dtype)
            y = torch.randn(n, device=device, dtype=dtype)
            out = torch.full_like(x, float("nan"))  # poison: unwritten elements stay NaN
            arch = arch_of(x)
            # GRETA's launch plan for this call (kernel, grid, arguments, config-table block).
            launch_plan = plan(arch, Meta.of(x), Meta.of(y))
            block = launch_plan.launches[0].constexprs["BLOCK"]
            run(launch_plan, (x, y), out=(out,))
            ref = x.double() + y.double()
            # Elementwise |out - ref| <= rtol * |ref| + atol: one rounding of the output.
            rtol = 1e-6 if dtype == torch.float32 else 1e-3
            excess = (out.double() - ref).abs() - rtol * ref.abs() - rtol
            err = float((out.double() - ref).abs().max())
            ok = not bool(torch.isnan(out).any()) and bool((excess <= 0).all())
            print(
                f"  {dtype!s:<14} n={n:<5} arch={arch:<8} BLOCK={block:<5} "
                f"max|err|={err:.2e} {'ok' if ok else 'WRONG'}"
            )
            if not ok:
                failures.append(f"{dtype} n={n}")
    if failures:
        return finish("FAIL", "wrong results for " + ", ".join(failures))
    if on_gpu:
        print(f"ran on {where} (compiled by Triton)")
    else:
        print("ran under TRITON_INTERPRET=1 (no GPU: the real kernel on Triton's CPU interpreter)")
    return finish("OK")


if __name__ == "__main__":
    sys.exit(main())
