"""What a CPU user runs: `torch.ops.greta.*` on CPU tensors without GRETA_TRITON_ON_CPU.

The rest of the suite puts CPU tensors on Triton's interpreter (conftest); a user's CPU
calls take the torch reference instead. Each op, in fp32/fp16/bf16, forward and (where it
has one) backward, against float64 maths written here, and the reference must be what ran.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import greta_core.torch  # noqa: E402, F401
from greta_core import observe  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Relative to the reference's magnitude (outputs are rounded to the input dtype).
TOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


@pytest.fixture(autouse=True)
def _cpu_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRETA_TRITON_ON_CPU", raising=False)


def _close(got: Any, want: Any, dtype: Any, scale: float = 1.0) -> None:
    assert got.dtype == dtype, got.dtype
    assert got.shape == want.shape
    err = (got.double() - want).abs().max().item()
    mag = max(want.abs().max().item(), 1.0)
    assert err <= TOL[dtype] * mag * scale, f"max abs err {err:.3e} (magnitude {mag:.3e})"


def _grads(fn: Callable[..., Any], inputs: list[Any], dy: Any) -> tuple[Any, list[Any]]:
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves)
    grads = torch.autograd.grad(out, leaves, dy)
    return out.detach(), list(grads)


def _check(
    op: str,
    dtype: Any,
    greta: Callable[..., Any],
    ref64: Callable[..., Any],
    inputs: list[Any],
    backward: bool = True,
) -> None:
    x64 = [t.double() for t in inputs]
    if not backward:
        out = greta(*inputs)
        assert observe.last_implementation(op) == "reference-torch"
        _close(out, ref64(*x64), dtype)
        return
    dy = torch.randn(ref64(*x64).shape, dtype=torch.float64)
    out, grads = _grads(greta, inputs, dy.to(dtype))
    assert observe.last_implementation(f"{op}_bwd") == "reference-torch"
    assert observe.last_implementation(op) == "reference-torch"
    want, want_grads = _grads(ref64, x64, dy)
    _close(out, want, dtype)
    for got_g, want_g in zip(grads, want_grads, strict=True):
        _close(got_g, want_g, dtype, scale=4.0)


def _rms64(x: Any, w: Any) -> Any:
    return x / (x.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * w


def _ln64(x: Any, w: Any, b: Any) -> Any:
    mu = x.mean(-1, keepdim=True)
    var = (x - mu).pow(2).mean(-1, keepdim=True)
    return (x - mu) / (var + 1e-5).sqrt() * w + b


def _attn64(q: Any, k: Any, v: Any) -> Any:
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    sq, skv = s.shape[-2:]
    mask = torch.ones(sq, skv, dtype=torch.bool).tril(skv - sq)  # bottom-right causal
    return torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ v


def _rope64(x: Any, cos: Any, sin: Any) -> Any:
    half = x.shape[-1] // 2
    c, s = cos[None, :, None], sin[None, :, None]
    lo, hi = x[..., :half], x[..., half:]
    return torch.cat([lo * c - hi * s, hi * c + lo * s], -1)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm(dtype: Any) -> None:
    x, w = torch.randn(3, 5, 40).to(dtype), torch.randn(40).to(dtype)
    _check("rms_norm", dtype, lambda x, w: torch.ops.greta.rms_norm(x, w, 1e-6), _rms64, [x, w])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_layer_norm(dtype: Any) -> None:
    x, w, b = torch.randn(4, 33).to(dtype), torch.randn(33).to(dtype), torch.randn(33).to(dtype)
    _check(
        "layer_norm",
        dtype,
        lambda x, w, b: torch.ops.greta.layer_norm(x, w, b, 1e-5),
        _ln64,
        [x, w, b],
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_softmax(dtype: Any) -> None:
    x = (torch.randn(6, 37) * 3).to(dtype)
    _check("softmax", dtype, torch.ops.greta.softmax, lambda x: torch.softmax(x, -1), [x])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_attention_causal_gqa(dtype: Any) -> None:
    q = torch.randn(2, 4, 5, 16).to(dtype)
    k, v = torch.randn(2, 2, 9, 16).to(dtype), torch.randn(2, 2, 9, 16).to(dtype)
    _check(
        "attention",
        dtype,
        lambda q, k, v: torch.ops.greta.attention(q, k, v, True),
        _attn64,
        [q, k, v],
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rope(dtype: Any) -> None:
    x = torch.randn(2, 7, 3, 16).to(dtype)
    ang = torch.rand(7, 8, dtype=torch.float64) * 6
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
    _check(
        "rope",
        dtype,
        lambda x: torch.ops.greta.rope(x, cos, sin),
        lambda x: _rope64(x, cos.double(), sin.double()),
        [x],
        backward=False,
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_matmul_and_vec_add(dtype: Any) -> None:
    a, b, bias = (
        torch.randn(5, 24).to(dtype),
        torch.randn(24, 7).to(dtype),
        torch.randn(7).to(dtype),
    )
    _check(
        "matmul",
        dtype,
        torch.ops.greta.matmul,
        lambda a, b, bias: a @ b + bias,
        [a, b, bias],
        backward=False,
    )
    x, y = torch.randn(1000).to(dtype), torch.randn(1000).to(dtype)
    _check("vec_add", dtype, torch.ops.greta.vec_add, torch.add, [x, y], backward=False)


def test_reference_path_refuses_what_the_gpu_path_refuses() -> None:
    x = torch.randn(4, 8)
    # GretaInputError is a ValueError (its home module moves with the error-base work).
    with pytest.raises(ValueError, match=r"argument 'weight' has shape \(9,\); expected \(8,\)"):
        torch.ops.greta.rms_norm(x, torch.randn(9), 1e-6)
    with pytest.raises(ValueError, match="argument 'x' has dtype int32"):
        torch.ops.greta.rms_norm(x.to(torch.int32), torch.ones(8, dtype=torch.int32), 1e-6)
