"""The smoke test itself: run by `greta_install.smoke` in the target environment's Python.

Run as a script (``python smoke_child.py gpu|cpu``), never imported by the installer:
it imports torch, triton and jax, which the installer half must not. Each step prints
one JSON line ``{"step", "ok", "seconds", "detail", "error"}``; a step that fails does
not stop the later ones, except that nothing runs on a device torch cannot see.
Shapes are tiny: on the CPU row Triton runs in its interpreter.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

STEPS = ("torch", "matmul", "triton", "sdpa", "greta-raw", "greta-torch", "jax", "greta-jax")


def _emit(
    step: str, ok: bool, seconds: float, detail: Any = None, error: str | None = None
) -> None:
    line = {"step": step, "ok": ok, "seconds": round(seconds, 3), "detail": detail, "error": error}
    print(json.dumps(line), flush=True)


def _run(step: str, fn: Callable[[], Any]) -> bool:
    start = time.perf_counter()
    try:
        detail = fn()
    except BaseException as exc:  # a smoke step reports every failure, even SystemExit
        tail = traceback.format_exception_only(type(exc), exc)[-1].strip()
        _emit(step, False, time.perf_counter() - start, None, tail[-800:])
        return False
    _emit(step, True, time.perf_counter() - start, detail)
    return True


def main(mode: str) -> int:
    gpu = mode == "gpu"
    state: dict[str, Any] = {}

    def torch_step() -> dict[str, Any]:
        import torch

        state["torch"] = torch
        info = {
            "version": torch.__version__,
            "hip": torch.version.hip,
            "cuda": torch.version.cuda,
        }
        if gpu:
            if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
                raise RuntimeError("torch sees no GPU (torch.cuda.is_available() is False)")
            info["device"] = torch.cuda.get_device_name(0)
            info["count"] = torch.cuda.device_count()
        state["device"] = "cuda" if gpu else "cpu"
        return info

    def matmul_step() -> dict[str, Any]:
        torch = state["torch"]
        gen = torch.Generator(device="cpu").manual_seed(0)
        a = torch.randn(64, 64, generator=gen)
        b = torch.randn(64, 64, generator=gen)
        want = a @ b
        got = (
            a.to(state["device"], torch.bfloat16) @ b.to(state["device"], torch.bfloat16)
        ).float()
        err = (got.cpu() - want).abs().max().item()
        if not err < 1.0:  # bf16 over k=64: ~0.1 typical
            raise AssertionError(f"bf16 matmul differs from fp32 by {err}")
        return {"max_abs_err": err}

    def triton_step() -> dict[str, Any]:
        torch = state["torch"]
        import triton
        import triton.language as tl

        @triton.jit
        def _add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(
                out_ptr + offs,
                tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask),
                mask=mask,
            )

        x = torch.arange(100, dtype=torch.float32, device=state["device"])
        y = torch.ones_like(x)
        out = torch.empty_like(x)
        _add[(triton.cdiv(100, 64),)](x, y, out, 100, BLOCK=64)
        if not torch.equal(out.cpu(), (x + y).cpu()):
            raise AssertionError("Triton kernel returned a wrong sum")
        return {"triton": triton.__version__}

    def sdpa_step() -> dict[str, Any]:
        torch = state["torch"]
        import torch.nn.functional as F

        gen = torch.Generator(device="cpu").manual_seed(1)
        dtype = torch.bfloat16 if gpu else torch.float32
        q, k, v = (
            torch.randn(1, 2, 16, 32, generator=gen).to(state["device"], dtype).requires_grad_()
            for _ in range(3)
        )
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.float().sum().backward()
        grads = [t.grad for t in (q, k, v)]
        if any(g is None or not torch.isfinite(g.float()).all() for g in grads):
            raise AssertionError("SDPA backward gave missing or non-finite gradients")
        return {"dtype": str(dtype)}

    def _rms_inputs() -> tuple[Any, Any, Any]:
        torch = state["torch"]
        gen = torch.Generator(device="cpu").manual_seed(2)
        x = torch.randn(4, 64, generator=gen)
        w = torch.rand(64, generator=gen) + 0.5
        ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
        return x, w, ref

    def greta_raw_step() -> dict[str, Any]:
        torch = state["torch"]
        from greta_core import raw

        x, w, ref = _rms_inputs()
        got = raw.rms_norm(x.to(state["device"]), w.to(state["device"]), 1e-6)
        err = (got.float().cpu() - ref).abs().max().item()
        if not err < 1e-3:
            raise AssertionError(f"greta_core.raw.rms_norm differs from the reference by {err}")
        del torch
        return {"max_abs_err": err}

    def greta_torch_step() -> dict[str, Any]:
        torch = state["torch"]
        import greta_core.torch  # noqa: F401  (registers torch.ops.greta.*)

        x, w, ref = _rms_inputs()
        x, w = x.to(state["device"]), w.to(state["device"])
        timings = []
        for _ in range(3):
            start = time.perf_counter()
            got = torch.ops.greta.rms_norm(x, w, 1e-6)
            if gpu:
                torch.cuda.synchronize()
            timings.append(time.perf_counter() - start)
        err = (got.float().cpu() - ref).abs().max().item()
        if not err < 1e-3:
            raise AssertionError(f"torch.ops.greta.rms_norm differs from the reference by {err}")
        # First call in this new process vs a warm call: how much JIT the user waits for.
        return {"max_abs_err": err, "first_ms": timings[0] * 1e3, "warm_ms": timings[-1] * 1e3}

    def jax_step() -> dict[str, Any]:
        import jax
        import jax.numpy as jnp

        state["jax"] = jax
        device = jax.devices()[0]
        if gpu and device.platform not in ("gpu", "cuda", "rocm"):
            raise RuntimeError(f"jax runs on {device.platform}, not on the GPU")
        x = jnp.arange(16.0)
        total = float(jnp.dot(x, x).block_until_ready())
        if total != 1240.0:
            raise AssertionError(f"jax computed {total}, expected 1240")
        return {"version": jax.__version__, "platform": device.platform}

    def greta_jax_step() -> dict[str, Any]:
        import jax.numpy as jnp
        import numpy as np

        from greta_core import jax as gjax

        x, w, ref = _rms_inputs()
        got = gjax.rms_norm(jnp.asarray(x.numpy()), jnp.asarray(w.numpy()), 1e-6)
        err = float(np.abs(np.asarray(got, dtype=np.float32) - ref.numpy()).max())
        if not err < 1e-3:
            raise AssertionError(f"greta_core.jax.rms_norm differs from the reference by {err}")
        return {"max_abs_err": err}

    ok = _run("torch", torch_step)
    if not ok:
        for step in STEPS[1:6]:
            _emit(step, False, 0.0, None, "skipped: torch is not usable")
    else:
        for step, fn in (
            ("matmul", matmul_step),
            ("triton", triton_step),
            ("sdpa", sdpa_step),
            ("greta-raw", greta_raw_step),
            ("greta-torch", greta_torch_step),
        ):
            ok = _run(step, fn) and ok
    jax_ok = _run("jax", jax_step)
    if jax_ok and "torch" in state:
        ok = _run("greta-jax", greta_jax_step) and ok
    else:
        _emit("greta-jax", False, 0.0, None, "skipped: jax or torch is not usable")
        ok = False
    return 0 if ok and jax_ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "cpu"))
