"""GEMM through all three bindings, against a float64 reference.

On a machine without a GPU the raw kernel runs under Triton's interpreter on small shapes;
on the H100 the same tests run on the GPU, plus the `gpu`-marked large shapes.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from _kernel_testing import expected_jax_impl  # noqa: E402

from greta_core import observe, raw  # noqa: E402
from greta_core.arch import interpreter_active  # noqa: E402

# Frobenius-norm relative error bounds for fp32 accumulation of fp16/bf16 operands.
TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2}


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _need_kernel() -> None:
    if _device() == "cpu" and not interpreter_active():
        pytest.skip("raw Triton on CPU needs TRITON_INTERPRET=1")


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm()).item()


def _operands(
    m: int, n: int, k: int, dtype: torch.dtype, b_transposed: bool, bias: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    dev = _device()
    a = torch.randn(m, k, device=dev, dtype=dtype)
    if b_transposed:  # a weight stored [N, K], used as w.t(): strides (1, K)
        b = torch.randn(n, k, device=dev, dtype=dtype).t()
    else:
        b = torch.randn(k, n, device=dev, dtype=dtype)
    c = torch.randn(n, device=dev, dtype=dtype) if bias else None
    return a, b, c


def _check(m: int, n: int, k: int, dtype: torch.dtype, b_t: bool, bias: bool) -> None:
    a, b, c = _operands(m, n, k, dtype, b_t, bias)
    out = torch.full((m, n), float("nan"), device=a.device, dtype=dtype)  # poison
    raw.matmul(a, b, c, out=out)
    ref = a.double() @ b.double() + (c.double() if bias else 0.0)
    assert not torch.isnan(out).any(), "some output elements were not written"
    assert _rel_err(out, ref) < TOL[dtype]
    assert observe.last_implementation("matmul") == (
        "triton-interpret" if a.device.type == "cpu" else "triton"
    )


@pytest.mark.parametrize(
    ("m", "n", "k", "b_t", "bias"),
    [
        (33, 47, 70, False, False),  # ragged in all three dims, K tail masked
        (33, 47, 70, True, True),  # transposed B view and bias
        (3, 130, 64, False, True),  # decode-like small M, N over two tiles, even K
        (65, 1, 33, True, False),  # N = 1
    ],
)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_raw_matmul_matches_reference(
    m: int, n: int, k: int, b_t: bool, bias: bool, dtype: torch.dtype
) -> None:
    _need_kernel()
    _check(m, n, k, dtype, b_t, bias)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("m", "n", "k", "b_t", "bias"),
    [
        (4096, 4096, 4096, False, False),
        (1000, 777, 1333, True, True),
        (7, 4096, 4096, True, True),
        (517, 1029, 4103, False, False),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_matmul_large(
    m: int, n: int, k: int, b_t: bool, bias: bool, dtype: torch.dtype
) -> None:
    _check(m, n, k, dtype, b_t, bias)


def test_raw_matmul_empty_k_gives_bias() -> None:
    _need_kernel()
    a, b, c = _operands(5, 6, 0, torch.float16, False, True)
    out = raw.matmul(a, b, c)
    assert torch.equal(out, c.expand(5, 6))


def test_raw_matmul_rejects_bad_input() -> None:
    a = torch.randn(4, 8, dtype=torch.float16, device=_device())
    b = torch.randn(8, 3, dtype=torch.float16, device=_device())
    with pytest.raises(raw.GretaInputError, match="argument 'a' has dtype float32"):
        raw.matmul(a.float(), b)
    with pytest.raises(raw.GretaInputError, match="argument 'b' has dtype"):
        raw.matmul(a, b.to(torch.bfloat16))
    with pytest.raises(raw.GretaInputError, match="argument 'b' has shape"):
        raw.matmul(a, torch.randn(7, 3, dtype=torch.float16, device=a.device))
    with pytest.raises(raw.GretaInputError, match="argument 'a' has 3 dimensions"):
        raw.matmul(a[None], b)
    with pytest.raises(raw.GretaInputError, match="argument 'bias' has shape"):
        raw.matmul(a, b, torch.randn(4, dtype=torch.float16, device=a.device))
    with pytest.raises(raw.GretaInputError, match="argument 'out' has shape"):
        raw.matmul(a, b, out=torch.empty(3, 3, dtype=torch.float16, device=a.device))


def test_torch_op_matmul_forward_opcheck_and_grads() -> None:
    import greta_core.torch  # noqa: F401

    dev = _device()
    a = torch.randn(19, 40, device=dev, dtype=torch.float16, requires_grad=True)
    b = torch.randn(40, 23, device=dev, dtype=torch.float16, requires_grad=True)
    c = torch.randn(23, device=dev, dtype=torch.float16, requires_grad=True)
    out = torch.ops.greta.matmul(a, b, c)
    ref_a, ref_b, ref_c = (t.detach().double().requires_grad_() for t in (a, b, c))
    ref = ref_a @ ref_b + ref_c
    assert _rel_err(out, ref.detach()) < TOL[torch.float16]
    grad = torch.randn_like(out)
    out.backward(grad)
    ref.backward(grad.double())
    for mine, theirs in ((a.grad, ref_a.grad), (b.grad, ref_b.grad), (c.grad, ref_c.grad)):
        assert _rel_err(mine, theirs) < TOL[torch.float16]
    # On CPU eager runs the interpreted kernel but tracing decomposes to the reference, whose
    # rounding may differ by an ulp; fp32 takes the reference both ways. On a GPU: the kernel.
    args = tuple(t.detach() for t in (a, b, c))
    if dev == "cpu":
        args = tuple(t.float() for t in args)
    torch.library.opcheck(torch.ops.greta.matmul.default, args)
    torch.library.opcheck(torch.ops.greta.matmul_fwd.default, args)  # the front's triton_op


def test_torch_op_matmul_gradcheck_on_reference_path() -> None:
    import greta_core.torch  # noqa: F401

    a = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, 7, dtype=torch.float64).t().requires_grad_()  # transposed view
    c = torch.randn(4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, y, z: torch.ops.greta.matmul(x, y, z), (a, b, c))
    assert torch.autograd.gradcheck(lambda x, y: torch.ops.greta.matmul(x, y), (a, b))
    assert observe.last_implementation("matmul") == "reference-torch"


def test_torch_op_matmul_rejects_bad_input() -> None:
    import greta_core.torch  # noqa: F401

    with pytest.raises(raw.GretaInputError, match="argument 'b' has shape"):
        torch.ops.greta.matmul(torch.randn(3, 4), torch.randn(5, 6))


def test_jax_matmul_and_grad(monkeypatch: pytest.MonkeyPatch) -> None:
    # jax-triton sets TRITON_CACHE_DIR="" on import, which breaks later Triton compiles of
    # the torch tests in this process; monkeypatch restores the variable afterwards.
    monkeypatch.setenv("TRITON_CACHE_DIR", os.environ.get("TRITON_CACHE_DIR", ""))
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    import numpy as np

    from greta_core import jax as gjax

    rng = np.random.default_rng(0)
    a = rng.standard_normal((9, 13))
    b = rng.standard_normal((13, 6))
    c = rng.standard_normal(6)
    out = gjax.matmul(jnp.asarray(a, jnp.float16), jnp.asarray(b, jnp.float16))
    ref = a.astype(np.float16).astype(np.float64) @ b.astype(np.float16).astype(np.float64)
    assert np.linalg.norm(np.asarray(out, np.float64) - ref) / np.linalg.norm(ref) < 2e-3
    assert observe.last_implementation("matmul") == expected_jax_impl()

    a32, b32, c32 = (jnp.asarray(x, jnp.float32) for x in (a, b, c))
    grads = jax.grad(lambda x, y, z: gjax.matmul(x, y, z).sum(), argnums=(0, 1, 2))(a32, b32, c32)
    ones = np.ones((9, 6))
    # fp32 takes jnp's matmul, which may use TF32 on a GPU (~1e-3 relative).
    np.testing.assert_allclose(np.asarray(grads[0]), ones @ b.T, rtol=5e-3, atol=5e-3)
    np.testing.assert_allclose(np.asarray(grads[1]), a.T @ ones, rtol=5e-3, atol=5e-3)
    np.testing.assert_allclose(np.asarray(grads[2]), np.full(6, 9.0), rtol=1e-6)
    with pytest.raises(ValueError, match="argument 'b' has dtype"):
        gjax.matmul(a32, jnp.asarray(b, jnp.float16))


@pytest.mark.parametrize("arch", ["sm_90", "gfx942", "gfx1100", "gfx1201", "default"])
def test_matmul_aot_specs_cover_the_kernel_signature(arch: str) -> None:
    from greta_core.kernels import matmul as kernel
    from greta_core.ops.declare import aot_specs
    from greta_core.ops.matmul import MATMUL

    specs = aot_specs(MATMUL, arch)
    names = {s.name for s in specs}
    assert len(names) == len(specs)
    # Both dtypes, with and without bias, both layouts (the unit strides Triton turns into
    # constants), for every distinct table config.
    units = {"rowmajor": {"stride_ak", "stride_bn", "stride_cn"},
             "b_transposed": {"stride_ak", "stride_bk", "stride_cn"}}  # fmt: skip
    covered = {
        (s.signature["a_ptr"], s.constexprs["HAS_BIAS"], layout)
        for s in specs
        for layout, unit in units.items()
        if {k for k, v in s.constexprs.items() if k.startswith("stride") and v == 1} == unit
    }
    assert covered == {(f"*{d}", b, lay) for d in ("fp16", "bf16") for b in (False, True)
                       for lay in units}  # fmt: skip
    for spec in specs:
        assert spec.uses_matrix_units
        assert set(spec.signature) | set(spec.constexprs) == set(kernel.matmul_kernel.arg_names)
        assert not set(spec.signature) & set(spec.constexprs)
        assert ("matrix_instr_nonkdim" in spec.options) == (arch == "gfx942")
