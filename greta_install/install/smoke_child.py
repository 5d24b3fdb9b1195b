"""The smoke test itself: run by `greta_install.install.smoke` in the target environment's Python.

Run as a script, isolated (``python -I smoke_child.py gpu|cpu`` from an empty folder),
never imported by the installer: it imports torch, triton and jax, which the installer
half must not. It is self-contained (the target environment need not have GRETA).

It first prints the steps it will report (``{"plan": [...]}``), then one JSON line per
step, ``{"step", "status", "seconds", "detail", "error", "note"}`` with status
``passed``, ``failed`` or ``skipped`` (with the reason in ``note``). A step that fails
does not stop the later ones, except that nothing runs on a device torch cannot use.

The numeric gate (matmul, chain, training, gradcheck) compares the device under test with
the CPU: every reference is computed on the CPU in float64 from the very values the device
got (inputs rounded to the device's dtype first), so a difference is the device's own
arithmetic, bounded below from the dtype's unit roundoff and the reduction length. On the
cpu row there is no GPU to compare: those checks still run on the CPU (a broken CPU torch
fails them) but are reported as skipped, never as passed. Shapes are tiny: the whole test
is a few seconds on a GPU, and the CPU row runs Triton in its interpreter.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

STEPS = (
    "torch",
    "matmul",
    "chain",
    "training",
    "gradcheck",
    "triton",
    "sdpa",
    "greta-raw",
    "greta-torch",
    "jax",
    "greta-jax",
)
TORCH_STEPS = STEPS[1:9]  # need a usable torch
NUMERIC_STEPS = ("matmul", "chain", "training", "gradcheck")  # GPU against CPU

# Unit roundoff u = 2^-p: the largest relative error of one correctly rounded operation.
U32 = 2.0**-24
U_BF16 = 2.0**-8
# Vendor math libraries are not correctly rounded: CUDA documents sinf, expf, tanhf and
# logf within 2 ulp, ROCm's ocml within 1-2 ulp, torch's CPU (Sleef) within 1-3.5 ulp.
# One ulp is at most 2u relative, so a budget of 4 ulp per call is 8u.
MATH_CALL = 8 * U32
MARGIN = 2.0  # every bound below is a worst-case bound; x2 absorbs the neglected O(u^2) terms

TRAIN_STEPS = 40
TRAIN_LR = 0.1
NO_GPU_NOTE = (
    "no GPU (cpu mode): ran on the CPU only, within tolerance of its float64 reference; "
    "the GPU-against-CPU comparison needs a GPU"
)


class Skipped:
    """What a step returns when it cannot be judged here (a package not installed)."""

    def __init__(self, why: str) -> None:
        self.why = why


def _emit(
    step: str,
    status: str,
    seconds: float,
    detail: Any = None,
    error: str | None = None,
    note: str | None = None,
) -> None:
    line = {
        "step": step,
        "status": status,
        "seconds": round(seconds, 3),
        "detail": detail,
        "error": error,
        "note": note,
    }
    print(json.dumps(line), flush=True)


def _run(step: str, fn: Callable[[], Any], cpu_only_note: str | None = None) -> bool:
    """Run one step; False only when it failed. `cpu_only_note`: a pass here proves less
    than the step promises, so it is reported as skipped with that note."""
    start = time.perf_counter()
    try:
        detail = fn()
    except BaseException as exc:  # a smoke step reports every failure, even SystemExit
        tail = traceback.format_exception_only(type(exc), exc)[-1].strip()
        # One line: a HIP/CUDA error's first line names it, the rest is advice on debugging.
        _emit(step, "failed", time.perf_counter() - start, None, tail.splitlines()[0][:800])
        return False
    if isinstance(detail, Skipped):
        _emit(step, "skipped", time.perf_counter() - start, None, None, detail.why)
        return True
    status = "skipped" if cpu_only_note else "passed"
    _emit(step, status, time.perf_counter() - start, detail, None, cpu_only_note)
    return True


def _gamma(n: int, u: float) -> float:
    """gamma_n = n*u / (1 - n*u): the worst-case relative error of a sum or dot product of
    n terms in any order (Higham, Accuracy and Stability, 2nd ed., section 3.1)."""
    return n * u / (1 - n * u)


def _accelerator(torch: Any) -> Any:
    """The GPU torch computes on (torch.device("cuda") on CUDA and ROCm), or None."""
    acc = getattr(torch, "accelerator", None)
    if acc is not None:
        return acc.current_accelerator() if acc.is_available() else None
    return torch.device("cuda") if torch.cuda.is_available() else None


def _within(what: str, got: Any, ref: Any, bound: Any) -> float:
    """max |got - ref| / bound over all elements; AssertionError naming the worst element
    when any is out of bounds or not finite (a NaN never compares as within)."""
    torch = sys.modules["torch"]
    got = got.detach().double().cpu()
    err = (got - ref).abs()
    ok = err <= bound
    bound = torch.broadcast_to(bound, err.shape)
    if not bool(ok.all()):
        ratio = torch.where(ok, torch.zeros_like(err), torch.nan_to_num(err / bound, nan=1e300))
        idx = int(ratio.reshape(-1).argmax())
        at = (
            [int(i) for i in torch.unravel_index(torch.tensor(idx), err.shape)] if err.dim() else []
        )
        raise AssertionError(
            f"{what}: {float(got.reshape(-1)[idx]):.6g} against the CPU's "
            f"{float(ref.reshape(-1)[idx]):.6g} at {at}, allowed "
            f"{float(bound.reshape(-1)[idx]):.3g} ({int((~ok).sum())} of {err.numel()} out of bounds)"
        )
    return float((err / bound).max())


def main(mode: str) -> int:
    gpu = mode == "gpu"
    cpu_only = None if gpu else NO_GPU_NOTE
    state: dict[str, Any] = {}
    print(json.dumps({"plan": list(STEPS)}), flush=True)

    def torch_step() -> dict[str, Any]:
        import torch

        state["torch"] = torch
        info: dict[str, Any] = {
            "version": torch.__version__,
            "hip": torch.version.hip,
            "cuda": torch.version.cuda,
        }
        dev = torch.device("cpu")
        if gpu:
            dev = _accelerator(torch)
            if dev is None:
                raise RuntimeError("torch sees no GPU (torch.cuda.is_available() is False)")
            if dev.type == "cuda":
                info["device"] = torch.cuda.get_device_name(0)
                info["count"] = torch.cuda.device_count()
                info["arch"] = getattr(torch.cuda.get_device_properties(0), "gcnArchName", None)
        state["device"] = dev
        # The first kernel on the device: a torch build without this GPU's code fails here
        # ("invalid device function" on ROCm, "no kernel image is available" on CUDA).
        probe = torch.arange(8, dtype=torch.float32, device=dev).mul(2).sum().item()
        if probe != 56.0:
            raise AssertionError(f"2 * sum(0..7) on the device gave {probe}, not 56")
        # The gate checks the kernels' arithmetic, so it asks for full precision: TF32 or
        # bf16-reduced split-K reductions would be correct yet outside the bounds below.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
        torch.set_float32_matmul_precision("highest")
        info["compute"] = str(dev)
        return info

    def matmul_step() -> dict[str, Any]:
        torch, dev = state["torch"], state["device"]
        gen = torch.Generator().manual_seed(0)
        k = 64
        a = torch.randn(48, k, generator=gen, dtype=torch.float64)
        b = torch.randn(k, 40, generator=gen, dtype=torch.float64)
        ratios = {}
        for dtype, u_out in ((torch.bfloat16, U_BF16), (torch.float32, U32)):
            ad, bd = a.to(dtype), b.to(dtype)  # rounded on the CPU: the reference sees these
            ref = ad.double() @ bd.double()
            # |C_hat - C| <= (gamma_k(u32) + u_out) * (|A| |B|) elementwise: fp32 accumulation
            # of k products (bf16 x bf16 products are exact in fp32), then one rounding of the
            # result to the output dtype.
            bound = MARGIN * (_gamma(k, U32) + u_out) * (ad.double().abs() @ bd.double().abs())
            got = ad.to(dev) @ bd.to(dev)
            name = str(dtype).removeprefix("torch.")
            ratios[name] = _within(f"{name} matmul (k={k})", got, ref, bound)
        return {"device": str(dev), "k": k, "max_err_over_bound": ratios}

    def _chain(x: Any) -> dict[str, Any]:
        torch = state["torch"]
        a = torch.exp(torch.sin(x) * 0.5) * x
        b = torch.tanh(x)
        y = a + b
        return {
            "a": a,
            "b": b,
            "y": y,
            "rowsum": y.sum(-1),
            "meansq": (y * y).mean(),
            "softmax": torch.softmax(y, -1),
            "logsumexp": torch.logsumexp(y, -1),
        }

    def chain_step() -> dict[str, Any]:
        torch, dev = state["torch"], state["device"]
        gen = torch.Generator().manual_seed(1)
        rows, n = 8, 512
        x = (torch.randn(rows, n, generator=gen, dtype=torch.float64) * 3).float()
        ref = _chain(x.double())
        got = _chain(x.to(dev))
        a, b, y = ref["a"].abs(), ref["b"].abs(), ref["y"]
        # y = exp(0.5 sin x) * x + tanh x: sin's abs error (<= MATH_CALL, |sin| <= 1) enters
        # exp's argument halved, exp adds its own, the product and the sum one rounding each:
        # |dy| <= (0.5 + 1 + 1) MATH_CALL |a| + MATH_CALL |b| + u |a+b| < 3 MATH_CALL (|a|+|b|).
        tol_y = MARGIN * 3 * MATH_CALL * (a + b)
        # A sum of n terms: each term's error plus gamma_n of the sum of magnitudes.
        tol_sum = MARGIN * (tol_y.sum(-1) + _gamma(n, U32) * y.abs().sum(-1))
        # mean(y^2) over all N terms: |d(y^2)| <= 2|y| dy + dy^2, then gamma_N and the division.
        big = rows * n
        tol_msq = (
            MARGIN
            * ((2 * y.abs() * tol_y + tol_y**2).sum() + _gamma(big + 1, U32) * (y * y).sum())
            / big
        )
        # softmax is shift-invariant, so the max subtracted cancels; each p_i carries its own
        # dy_i, the normaliser the worst dy_j, the subtraction u |y - max|, exp MATH_CALL,
        # the sum gamma_n and the division u: relative to p.
        delta = tol_y.amax(-1, keepdim=True)
        spread = (y - y.amax(-1, keepdim=True)).abs().amax(-1, keepdim=True)
        rel_p = tol_y + delta + 2 * U32 * spread + 2 * MATH_CALL + _gamma(n + 1, U32)
        tol_p = MARGIN * rel_p * ref["softmax"]
        # logsumexp = m + log(sum exp(y - m)): the sum's relative error becomes an absolute
        # error of the log, log adds MATH_CALL of its value, the final add u |lse|.
        log_s = ref["logsumexp"] - y.amax(-1)
        tol_lse = MARGIN * (
            delta.squeeze(-1)
            + U32 * spread.squeeze(-1)
            + MATH_CALL
            + _gamma(n, U32)
            + MATH_CALL * log_s.abs()
            + U32 * ref["logsumexp"].abs()
        )
        ratios = {
            "elementwise": _within("exp(0.5 sin x) x + tanh x", got["y"], y, tol_y),
            "rowsum": _within(f"row sum (n={n})", got["rowsum"], ref["rowsum"], tol_sum),
            "meansq": _within(f"mean of squares (n={big})", got["meansq"], ref["meansq"], tol_msq),
            "softmax": _within(f"softmax (n={n})", got["softmax"], ref["softmax"], tol_p),
            "logsumexp": _within(f"logsumexp (n={n})", got["logsumexp"], ref["logsumexp"], tol_lse),
        }
        return {"device": str(dev), "dtype": "float32", "n": n, "max_err_over_bound": ratios}

    def _train(model: Any, x: Any, y: Any) -> list[float]:
        torch = state["torch"]
        params = list(model.parameters())
        losses = []
        # Plain SGD by hand: torch.optim's first step imports torch._dynamo (tens of seconds
        # on a small CPU), more than the whole smoke test may take.
        for _ in range(TRAIN_STEPS):
            loss = torch.nn.functional.mse_loss(model(x), y)
            grads = torch.autograd.grad(loss, params)
            with torch.no_grad():
                for p, g in zip(params, grads, strict=True):
                    p.sub_(TRAIN_LR * g)
            losses.append(float(loss.detach()))
        losses.append(float(torch.nn.functional.mse_loss(model(x), y).detach()))
        return losses

    def training_step() -> dict[str, Any]:
        # The failure this catches: unslothai/unsloth#8412 (gfx1033) matched the CPU's forward
        # to 4e-7 while SGD went from 0.9710 to 0.1148 on the CPU and to nan on the GPU.
        torch, dev = state["torch"], state["device"]
        nn = torch.nn
        gen = torch.Generator().manual_seed(2)
        batch, width = 64, 16
        x = torch.randn(batch, 8, generator=gen, dtype=torch.float64).float()
        w_true = torch.randn(8, 1, generator=gen, dtype=torch.float64)
        y = torch.tanh(0.5 * (x.double() @ w_true)).float()
        torch.manual_seed(3)  # the same initial weights for both runs
        model = nn.Sequential(
            nn.Linear(8, width, dtype=torch.float64),
            nn.Tanh(),
            nn.Linear(width, 1, dtype=torch.float64),
        )
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.float().double())  # both runs start from the same fp32 values
        ref = _train(copy.deepcopy(model), x.double(), y.double())
        if not ref[-1] < 0.5 * ref[0]:
            raise AssertionError(
                f"the CPU's float64 training did not converge: {ref[0]:.4g} -> {ref[-1]:.4g}"
            )
        got = _train(copy.deepcopy(model).to(dev, torch.float32), x.to(dev), y.to(dev))
        # Each fp32 forward/backward rounds reductions of at most K = max(batch, width) terms,
        # so one step's loss and gradient carry a relative error of about gamma_K(u32); gradient
        # descent adds each step's error to the weights, and a step can grow an existing error
        # by at most 1 + lr |lambda| (lambda: a Hessian eigenvalue, O(1) for this net), so
        # after T steps the loss is within about C * T * gamma_K(u32) of the CPU's, relative
        # to the larger loss; C = 16 covers that growth (MARGIN included). A device whose
        # gradients are wrong drifts by O(1) of the loss, and a NaN is never within.
        rel = 16 * TRAIN_STEPS * _gamma(max(batch, width), U32)
        worst = 0.0
        for t, (g, r) in enumerate(zip(got, ref, strict=True)):
            allowed = rel * max(ref[0], r)
            if not abs(g - r) <= allowed:
                raise AssertionError(
                    f"SGD on {dev} diverged from the CPU at step {t} of {TRAIN_STEPS}: "
                    f"loss {g:.6g} against {r:.6g} (allowed {allowed:.2g}); the CPU went "
                    f"{ref[0]:.4g} -> {ref[-1]:.4g}, the device {got[0]:.4g} -> {got[-1]:.4g}"
                )
            worst = max(worst, abs(g - r) / allowed)
        return {
            "device": str(dev),
            "steps": TRAIN_STEPS,
            "loss_cpu": [round(ref[0], 6), round(ref[-1], 6)],
            "loss_device": [round(got[0], 6), round(got[-1], 6)],
            "max_err_over_bound": worst,
        }

    def gradcheck_step() -> dict[str, Any]:
        torch, dev = state["torch"], state["device"]
        gen = torch.Generator().manual_seed(4)
        x = torch.randn(4, 5, generator=gen, dtype=torch.float64).to(dev).requires_grad_()
        w = torch.randn(5, 3, generator=gen, dtype=torch.float64).to(dev).requires_grad_()

        def op(x: Any, w: Any) -> Any:
            return torch.softmax(torch.tanh(x @ w), -1) * x.sum(-1, keepdim=True)

        # float64 central differences with eps = 1e-6: truncation O(eps^2) ~ 1e-12 and rounding
        # O(u64 / eps) ~ 1e-10, far inside torch's atol 1e-5 / rtol 1e-3; a wrong backward
        # kernel is off by O(1).
        try:
            torch.autograd.gradcheck(op, (x, w), eps=1e-6, atol=1e-5, rtol=1e-3)
        except torch.autograd.gradcheck.GradcheckError as exc:
            raise AssertionError(
                f"float64 gradcheck on {dev}: {str(exc).splitlines()[0]}"
            ) from None
        return {"device": str(dev), "op": "softmax(tanh(x @ w)) * sum(x)", "dtype": "float64"}

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

    def _no_greta() -> Skipped | None:
        if importlib.util.find_spec("greta_core") is None:
            return Skipped("greta_core is not installed in this environment")
        return None

    def _rms_case() -> tuple[Any, Any, Any, Any]:
        """fp32 inputs, the float64 reference from them and its bound.

        Mean of n squares: gamma_n; rsqrt (an approximate instruction on GPUs) MATH_CALL plus
        half the mean's error; two products u each: relative to |ref|, no cancellation."""
        torch = state["torch"]
        gen = torch.Generator(device="cpu").manual_seed(5)
        n = 64
        x = torch.randn(4, n, generator=gen, dtype=torch.float64).float()
        w = (torch.rand(n, generator=gen, dtype=torch.float64) + 0.5).float()
        xd, wd = x.double(), w.double()
        ref = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * wd
        bound = MARGIN * (1.5 * _gamma(n + 1, U32) + MATH_CALL + 2 * U32) * ref.abs()
        return x, w, ref, bound

    def greta_raw_step() -> dict[str, Any] | Skipped:
        if skipped := _no_greta():
            return skipped
        from greta_core import raw

        x, w, ref, bound = _rms_case()
        got = raw.rms_norm(x.to(state["device"]), w.to(state["device"]), 1e-6)
        return {"max_err_over_bound": _within("greta_core.raw.rms_norm", got, ref, bound)}

    def greta_torch_step() -> dict[str, Any] | Skipped:
        if skipped := _no_greta():
            return skipped
        torch, dev = state["torch"], state["device"]
        import greta_core.torch  # noqa: F401  (registers torch.ops.greta.*)

        x, w, ref, bound = _rms_case()
        x, w = x.to(dev), w.to(dev)
        timings = []
        for _ in range(3):
            start = time.perf_counter()
            got = torch.ops.greta.rms_norm(x, w, 1e-6)
            if dev.type != "cpu":
                torch.cuda.synchronize()
            timings.append(time.perf_counter() - start)
        ratio = _within("torch.ops.greta.rms_norm", got, ref, bound)
        # First call in this new process vs a warm call: how much JIT the user waits for.
        return {
            "max_err_over_bound": ratio,
            "first_ms": timings[0] * 1e3,
            "warm_ms": timings[-1] * 1e3,
        }

    def jax_step() -> dict[str, Any] | Skipped:
        if importlib.util.find_spec("jax") is None:
            return Skipped("jax is not installed in this environment")
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

    def greta_jax_step() -> dict[str, Any] | Skipped:
        if "jax" not in state:
            return Skipped("jax is not installed in this environment")
        if skipped := _no_greta():
            return skipped
        import jax.numpy as jnp

        from greta_core import jax as gjax
        from greta_core.jax import _runtime

        triton_ok, why = _runtime.jax_triton_status()
        if gpu and not triton_ok and importlib.util.find_spec("jax_triton") is not None:
            raise RuntimeError(f"jax-triton is installed but unusable: {why}")
        x, w, ref, bound = _rms_case()
        got = gjax.rms_norm(jnp.asarray(x.numpy()), jnp.asarray(w.numpy()), 1e-6)
        got = state["torch"].tensor(_np(got))  # a copy: jax's buffers are read-only
        ratio = _within("greta_core.jax.rms_norm", got, ref, bound)
        if gpu and not triton_ok:
            return Skipped(f"{why}: greta_core.jax ran its jax.numpy reference (within bounds)")
        return {"max_err_over_bound": ratio, "path": why}

    torch_ok = _run("torch", torch_step)
    ok = torch_ok
    if not torch_ok:
        for step in TORCH_STEPS:
            _emit(step, "failed", 0.0, None, "not run: torch is not usable")
    else:
        for step, fn in (
            ("matmul", matmul_step),
            ("chain", chain_step),
            ("training", training_step),
            ("gradcheck", gradcheck_step),
            ("triton", triton_step),
            ("sdpa", sdpa_step),
            ("greta-raw", greta_raw_step),
            ("greta-torch", greta_torch_step),
        ):
            note = cpu_only if step in NUMERIC_STEPS else None
            ok = _run(step, fn, note) and ok
    jax_ok = _run("jax", jax_step)
    if not torch_ok:
        _emit("greta-jax", "failed", 0.0, None, "not run: torch is not usable")
    elif not jax_ok:
        _emit("greta-jax", "failed", 0.0, None, "not run: jax is not usable")
    else:
        ok = _run("greta-jax", greta_jax_step) and ok
    return 0 if ok and jax_ok else 1


def _np(array: Any) -> Any:
    import numpy as np

    return np.array(array, dtype=np.float64)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "cpu"))
