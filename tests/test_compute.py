"""GretaCompute: every implementation of every op, forced, against a float64 reference."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from _kernel_testing import PassthroughMode, cuda_stand_in  # noqa: E402

from greta_core import compute, observe  # noqa: E402
from greta_core.compute import (  # noqa: E402
    GretaConfigError,
    GretaUnavailableError,
    ops_attention,
)

# GRETA's kernels in training too (the tables hand small norm/softmax training calls to torch).
pytestmark = pytest.mark.usefixtures("greta_training")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.bfloat16] + ([torch.float16] if DEVICE == "cuda" else [])
# max |got - want| / max |want| allowed, by operand dtype (float64 reference).
TOL = {torch.float32: 2e-5, torch.float16: 5e-3, torch.bfloat16: 2e-2, torch.float64: 1e-12}


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in __import__("os").environ if n.startswith("GRETA_IMPL")]:
        monkeypatch.delenv(name)
    compute.clear_cache()


def _rand(*shape: int, dtype: Any) -> Any:
    return torch.randn(*shape, device=DEVICE).to(dtype)


# --- independent float64 references (loops, no shared code with the implementations) -----


def _attention_ref(q: Any, k: Any, v: Any, q_lens: list[int], kv_lens: list[int]) -> Any:
    q, k, v = q.double().cpu(), k.double().cpu(), v.double().cpu()
    b, hq, sq, d = q.shape
    out = torch.zeros(b, hq, sq, d, dtype=torch.float64)
    group = hq // k.shape[1]
    for bi in range(b):
        for h in range(hq):
            for i in range(q_lens[bi]):
                last = kv_lens[bi] - q_lens[bi] + i  # causal, bottom-right aligned
                keys = k[bi, h // group, : last + 1]
                w = torch.softmax(keys @ q[bi, h, i] / math.sqrt(d), dim=0)
                out[bi, h, i] = w @ v[bi, h // group, : last + 1]
    return out


def _case(op: str, dtype: Any) -> tuple[tuple[Any, ...], Callable[[], Any], Callable[[Any], Any]]:
    """(args, reference(), result-extractor) for one op; odd, non-power-of-two sizes."""
    if op == "matmul":
        a, b, bias = _rand(5, 37, dtype=dtype), _rand(37, 19, dtype=dtype), _rand(19, dtype=dtype)
        return (a, b, bias), lambda: a.double() @ b.double() + bias.double(), lambda r: r
    if op == "attention":
        # Head dim 64: the smallest the GRETA kernel takes, so every implementation runs.
        q, k, v = (_rand(2, 4, 5, 64, dtype=dtype), _rand(2, 2, 11, 64, dtype=dtype),
                   _rand(2, 2, 11, 64, dtype=dtype))  # fmt: skip
        ql = torch.tensor([5, 3], device=DEVICE, dtype=torch.int32)
        kvl = torch.tensor([11, 7], device=DEVICE, dtype=torch.int32)
        return (
            (q, k, v, True, None, ql, kvl),
            lambda: _attention_ref(q, k, v, [5, 3], [11, 7]),
            lambda r: r,
        )
    if op == "rms_norm":
        x, w = _rand(3, 7, 33, dtype=dtype), _rand(33, dtype=dtype)
        xd = x.double()
        return (
            (x, w, 1e-6),
            lambda: xd / (xd.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * w.double(),
            lambda r: r,
        )
    if op == "layer_norm":
        x, w, b = _rand(3, 7, 33, dtype=dtype), _rand(33, dtype=dtype), _rand(33, dtype=dtype)
        return (
            (x, w, b, 1e-5),
            lambda: torch.nn.functional.layer_norm(x.double(), (33,), w.double(), b.double(), 1e-5),
            lambda r: r,
        )
    if op == "softmax":
        x = _rand(4, 37, dtype=dtype) * 3
        return (x,), lambda: torch.softmax(x.double(), -1), lambda r: r
    if op == "rope":
        x = _rand(2, 5, 3, 16, dtype=dtype)
        ang = torch.rand(5, 8, device=DEVICE, dtype=torch.float64) * 6
        cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)

        def ref() -> Any:
            xd, c, s = x.double(), cos.double()[None, :, None], sin.double()[None, :, None]
            out = xd.clone()
            out[..., :8] = xd[..., :8] * c - xd[..., 8:] * s
            out[..., 8:] = xd[..., 8:] * c + xd[..., :8] * s
            return out

        return (x, cos, sin), ref, lambda r: r
    if op == "kv_cache_append":
        kc, vc = _rand(2, 2, 9, 16, dtype=dtype), _rand(2, 2, 9, 16, dtype=dtype)
        kn, vn = _rand(2, 2, 3, 16, dtype=dtype), _rand(2, 2, 3, 16, dtype=dtype)
        lens = torch.tensor([0, 4], device=DEVICE, dtype=torch.int32)
        k0, v0 = kc.clone(), vc.clone()

        def ref() -> Any:
            k1, v1 = k0.clone(), v0.clone()
            for bi, start in enumerate([0, 4]):
                k1[bi, :, start : start + 3] = kn[bi]
                v1[bi, :, start : start + 3] = vn[bi]
            return torch.cat([k1, v1]).double()

        return (kc, vc, kn, vn, lens), ref, lambda r: torch.cat([kc, vc])
    if op == "conv2d":
        x, w, b = (
            _rand(2, 3, 9, 11, dtype=dtype),
            _rand(4, 3, 3, 3, dtype=dtype),
            _rand(4, dtype=dtype),
        )
        return (
            (x, w, b, 1, 1),
            lambda: torch.nn.functional.conv2d(
                x.double().cpu(), w.double().cpu(), b.double().cpu(), 1, 1
            ),
            lambda r: r,
        )
    raise AssertionError(op)


PAIRS = [(op, impl.name) for op in compute.ops() for impl in compute.REGISTRY[op].impls]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("op", "impl"), PAIRS, ids=[f"{o}-{i}" for o, i in PAIRS])
def test_forced_implementation_matches_reference(op: str, impl: str, dtype: Any) -> None:
    args, reference, extract = _case(op, dtype)
    fn = getattr(compute, op)
    probe = compute.REGISTRY[op].impl(impl).probe
    info = compute.REGISTRY[op].info(*args)
    why = probe(info)
    with compute.force(op, impl):
        if why is not None:
            with pytest.raises(GretaUnavailableError, match=rf"{op} implementation '{impl}'"):
                fn(*args)
            pytest.skip(f"{op}/{impl} unavailable here: {why}")
        result = extract(fn(*args))
    assert observe.last_implementation(f"compute.{op}") == impl
    want = reference().to(result.device)
    got = result.double()
    assert not torch.isnan(got).any()
    err = float((got - want).abs().max() / want.abs().max())
    assert err <= TOL[dtype], f"{op}/{impl} {dtype}: relative error {err:.2e}"


# Unforced, float32 operands: GRETA's kernel wherever it takes the call (a GPU, or Triton's
# interpreter on a CPU as in this suite). GRETA's GPU GEMM and attention kernels take
# fp16/bf16 only, so float32 goes to cuBLAS/hipBLASLt and to SDPA's memory-efficient kernel
# (flash takes no fp32) on a GPU, and GEMM to the torch reference on a CPU; conv2d has no
# GRETA kernel.
UNFORCED_FP32 = {
    "cpu": {"matmul": "reference", "conv2d": "reference"},
    "cuda": {"matmul": "vendor", "attention": "sdpa-efficient", "conv2d": "vendor"},
}


def test_unforced_picks_the_expected_implementation() -> None:
    assert set(compute.ops()) == {
        "matmul", "attention", "rms_norm", "layer_norm", "softmax", "rope", "kv_cache_append",
        "conv2d",
    }  # fmt: skip
    ran = {}
    for op in compute.ops():
        args, _, _ = _case(op, torch.float32)
        getattr(compute, op)(*args)
        ran[op] = observe.last_implementation(f"compute.{op}")
    assert ran == {op: UNFORCED_FP32[DEVICE].get(op, "greta") for op in compute.ops()}


@pytest.mark.skipif(DEVICE != "cpu", reason="the CPU has no vendor GPU library")
def test_forced_vendor_on_cpu_is_an_error_not_a_substitute() -> None:
    a, b = torch.randn(3, 4), torch.randn(4, 2)
    with compute.force("matmul", "vendor"), pytest.raises(GretaUnavailableError) as err:
        compute.matmul(a, b)
    assert "needs a CUDA/ROCm GPU" in str(err.value) and "no other is substituted" in str(err.value)
    with (
        compute.force("attention", "vendor"),
        pytest.raises(GretaUnavailableError, match="sdpa-flash"),
    ):
        compute.attention(torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8))


def test_env_forcing(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = torch.randn(3, 4, device=DEVICE), torch.randn(4, 2, device=DEVICE)
    monkeypatch.setenv("GRETA_IMPL_MATMUL", "reference")
    compute.matmul(a, b)
    assert observe.last_implementation("compute.matmul") == "reference"
    monkeypatch.delenv("GRETA_IMPL_MATMUL")
    monkeypatch.setenv("GRETA_IMPL", "softmax=reference, matmul=reference")
    compute.softmax(a)
    assert observe.last_implementation("compute.softmax") == "reference"
    assert compute.forced("matmul") == ("reference", "GRETA_IMPL")
    # The API wins over the environment.
    with compute.force("matmul", "greta"):
        assert compute.forced("matmul") == ("greta", "greta_core.compute.force")
    compute.set_impl("matmul", "vendor")
    assert compute.forced("matmul") == ("vendor", "greta_core.compute.set_impl")
    compute.set_impl("matmul", None)
    assert compute.forced("matmul") == ("reference", "GRETA_IMPL")


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        ("GRETA_IMPL_MATMUL", "cublas", "matmul has no implementation 'cublas'"),
        ("GRETA_IMPL", "matmul", "expected OP=IMPL pairs"),
        ("GRETA_IMPL", "matmull=vendor", "unknown operation 'matmull'"),
        ("GRETA_IMPL_ROPE", "vendor", "rope has no implementation 'vendor'"),
    ],
)
def test_bad_env_values_are_clear_errors(
    monkeypatch: pytest.MonkeyPatch, var: str, value: str, message: str
) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(GretaConfigError, match=message):
        compute.matmul(torch.randn(2, 2), torch.randn(2, 2)) if var != "GRETA_IMPL_ROPE" else (
            compute.forced("rope")
        )


def test_force_rejects_unknown_names() -> None:
    with (
        pytest.raises(GretaConfigError, match="choose one of"),
        compute.force("attention", "flash"),
    ):
        pass
    with pytest.raises(GretaConfigError, match="unknown operation"):
        compute.set_impl("gemm", "vendor")


def test_sdpa_wrapper_semantics_on_cpu() -> None:
    """The SDPA wrappers' masking (bottom-right causal, lengths, GQA) on real SDPA kernels.

    Calls the math wrapper directly, so its masks are checked on the CPU too; the GPU
    backends are covered by the forced tests above.
    """
    q, k, v = torch.randn(2, 4, 5, 16), torch.randn(2, 2, 11, 16), torch.randn(2, 2, 11, 16)
    fn = ops_attention._sdpa("sdpa-math")
    # Plain decode-style call (no lengths): bottom-right causal through a mask.
    got = fn(q, k, v, True, None, None, None)
    want = _attention_ref(q, k, v, [5, 5], [11, 11])
    assert torch.allclose(got.double(), want, atol=1e-5)
    ql, kvl = torch.tensor([5, 3], dtype=torch.int32), torch.tensor([11, 7], dtype=torch.int32)
    got = fn(q, k, v, True, None, ql, kvl)
    assert torch.allclose(got.double(), _attention_ref(q, k, v, [5, 3], [11, 7]), atol=1e-5)


def test_attention_mask_helper() -> None:
    allowed, valid = ops_attention.masks(1, 3, 5, True, torch.tensor([2]), torch.tensor([4]), "cpu")
    # Row i at position kv_len - q_len + i = 2 + i; rows >= q_len are invalid.
    assert allowed[0, 0].int().tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 0]]
    assert valid[0, 0, :, 0].tolist() == [True, True, False]


def test_default_device_and_dtype() -> None:
    assert compute.default_device() == DEVICE
    assert compute.default_dtype("cpu") == torch.float32
    assert compute.resolve_dtype("bf16", "cpu") == torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype"):
        compute.resolve_dtype("int8", "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize(
    "impl", ["greta", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "sdpa-math"]
)
@pytest.mark.parametrize(("sq", "skv"), [(64, 64), (1, 77)], ids=["prefill", "decode"])
def test_attention_backends_without_lengths(impl: str, sq: int, skv: int) -> None:
    """Flash/cuDNN take no mask: exercise them on the mask-free prefill and decode shapes."""
    q = torch.randn(2, 8, sq, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 2, skv, 64, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, 2, skv, 64, device="cuda", dtype=torch.bfloat16)
    info = compute.REGISTRY["attention"].info(q, k, v, True)
    why = compute.REGISTRY["attention"].impl(impl).probe(info)
    if why is not None:
        pytest.skip(f"{impl} unavailable: {why}")
    with compute.force("attention", impl):
        got = compute.attention(q, k, v, True)
    want = _attention_ref(q, k, v, [sq, sq], [skv, skv])
    err = float((got.double().cpu() - want).abs().max() / want.abs().max())
    assert err <= TOL[torch.bfloat16]


# --- the eager fast path (raw launch instead of torch.library dispatch) --------------------


def test_eager_raw_never_on_cpu_or_under_a_mode() -> None:
    from greta_core.compute._probes import eager_raw

    x = torch.randn(4, 8)
    assert eager_raw(x) is False  # CPU tensors always take the torch op

    with PassthroughMode():
        assert eager_raw(x) is False
    with torch.device("cpu"):  # a torch function mode
        assert eager_raw(x) is False


def test_eager_training_tells_no_grad_eager_and_torch_op_apart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """eager_training (the fronts' one pass): None where autograd records nothing (grad
    mode off, no input wanting a gradient: the no-grad path decides); True for plain GPU
    tensors (a subclass reporting is_cuda stands in, counted plain), no dispatch or function
    mode, no functorch transform; False (the torch op's autograd) for anything else."""
    from greta_core.ops import _calls

    CudaLike = cuda_stand_in(monkeypatch)
    x = torch.randn(4, 8).as_subclass(CudaLike)
    xg = torch.randn(4, 8).as_subclass(CudaLike).requires_grad_()
    assert _calls.eager_training((xg, x, None)) is True
    assert _calls.eager_raw(xg, x) is False  # the no-grad front declines the same call
    assert _calls.eager_training((x, x)) is None  # nothing wants a gradient
    with torch.no_grad():
        assert _calls.eager_training((xg, x)) is None
    assert _calls.eager_training((xg, torch.randn(4, 8))) is False  # a CPU tensor
    assert _calls.eager_training((torch.randn(4, 8), xg)) is False  # whichever comes first

    with PassthroughMode():
        assert _calls.eager_training((xg, x)) is False
    with torch.device("cpu"):  # a torch function mode
        assert _calls.eager_training((xg, x)) is False
    seen = []
    torch.func.grad(lambda t: seen.append(_calls.eager_training((xg, x))) or t.sum())(torch.ones(3))
    assert seen == [False]  # inside a functorch transform


@pytest.mark.gpu
def test_eager_fast_path_only_when_nothing_needs_torch_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    import greta_core.ops.rms_norm as raw_rms
    from greta_core.compute._probes import eager_raw

    calls = []
    real = raw_rms.rms_norm
    monkeypatch.setattr(raw_rms, "rms_norm", lambda *a: calls.append(1) or real(*a))
    x = torch.randn(8, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(256, device="cuda", dtype=torch.bfloat16)
    assert eager_raw(x, w) is True
    y = compute.rms_norm(x, w, 1e-6)
    assert calls == [1]
    torch.testing.assert_close(y, torch.ops.greta.rms_norm(x, w, 1e-6), rtol=0, atol=0)
    # A gradient wanted: the torch op (with its autograd) runs, and backward works.
    xg = x.clone().requires_grad_(True)
    assert eager_raw(xg, w) is False
    compute.rms_norm(xg, w, 1e-6).float().sum().backward()
    assert calls == [1] and xg.grad is not None and xg.grad.shape == x.shape
    with torch.no_grad():
        compute.rms_norm(xg, w, 1e-6)
    assert calls == [1, 1]  # no grad mode: the fast path is fine again
    # A tensor subclass, or torch.compile tracing, never takes it.
    with torch.device("cuda"):
        assert eager_raw(x, w) is False
    compiled = torch.compile(lambda a, b: compute.rms_norm(a, b, 1e-6), fullgraph=False)
    torch.testing.assert_close(compiled(x, w), y, rtol=0, atol=0)
