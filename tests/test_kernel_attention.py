"""Attention forward through all three bindings, against a float64 reference.

On a machine without a GPU the raw kernel runs under Triton's interpreter on small shapes;
on the H100 the same tests run on the GPU, plus the `gpu`-marked large shapes.
"""

from __future__ import annotations

import math
import os
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from _kernel_testing import ON_GPU, PassthroughMode, expected_impl, expected_jax_impl  # noqa: E402

from greta_core import observe, raw  # noqa: E402
from greta_core.arch import interpreter_active  # noqa: E402
from greta_core.ops import attention as attn_ops  # noqa: E402

TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2}


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _need_kernel() -> None:
    if _device() == "cpu" and not interpreter_active():
        pytest.skip("raw Triton on CPU needs TRITON_INTERPRET=1")


def reference64(q, k, v, causal, scale=None, q_lens=None, kv_lens=None):
    """Independent float64 reference, written from the documented rule (not the op's code)."""
    bsz, hq, sq, d = q.shape
    skv = k.shape[2]
    group = hq // k.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = torch.zeros(bsz, hq, sq, d, dtype=torch.float64)
    lse = torch.full((bsz, hq, sq), -math.inf, dtype=torch.float64)
    for b_i in range(bsz):
        q_len = sq if q_lens is None else int(q_lens[b_i])
        kv_len = skv if kv_lens is None else int(kv_lens[b_i])
        for h in range(hq):
            qs = q[b_i, h].double().cpu()
            ks = k[b_i, h // group].double().cpu()
            vs = v[b_i, h // group].double().cpu()
            for i in range(q_len):
                last = kv_len - 1
                if causal:
                    last = min(last, kv_len - q_len + i)
                if last < 0:
                    continue
                s = (ks[: last + 1] @ qs[i]) * scale
                lse[b_i, h, i] = torch.logsumexp(s, 0)
                out[b_i, h, i] = torch.softmax(s, 0) @ vs[: last + 1]
    return out, lse


def _inputs(bsz, hq, hkv, sq, skv, d, dtype):
    dev = _device()
    q = torch.randn(bsz, hq, sq, d, device=dev, dtype=dtype)
    k = torch.randn(bsz, hkv, skv, d, device=dev, dtype=dtype)
    v = torch.randn(bsz, hkv, skv, d, device=dev, dtype=dtype)
    return q, k, v


def _lens(values):
    if values is None:
        return None
    return torch.tensor(values, dtype=torch.int32, device=_device())


def _run_poisoned(q, k, v, causal, scale, q_lens, kv_lens):
    arch = attn_ops.validate(q, k, v, q_lens, kv_lens)
    bsz, hq, sq, d = q.shape
    out = torch.full((bsz, hq, sq, d), float("nan"), device=q.device, dtype=q.dtype)
    lse = torch.full((bsz, hq, sq), float("nan"), device=q.device, dtype=torch.float32)
    attn_ops.launch(q, k, v, causal, scale, q_lens, kv_lens, out, lse, arch)
    return out, lse


def _compare(out, lse, ref, ref_lse, dtype):
    assert not torch.isnan(out).any(), "some output elements were not written"
    assert not torch.isnan(lse).any(), "some logsumexp elements were not written"
    err = ((out.double().cpu() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    assert err < TOL[dtype]
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse.cpu()), finite)
    assert (lse.double().cpu()[finite] - ref_lse[finite]).abs().max().item() < 1e-3


CASES = [
    # (B, Hq, Hkv, Sq, Skv, D, causal, q_lens, kv_lens)
    (1, 2, 2, 37, 37, 64, False, None, None),
    (1, 2, 2, 37, 37, 64, True, None, None),
    (2, 4, 2, 21, 21, 64, True, None, None),  # grouped-query heads
    (2, 2, 1, 30, 30, 64, True, [30, 11], [30, 11]),  # padded varlen prefill
    (3, 4, 2, 1, 45, 64, True, [1, 1, 1], [45, 20, 1]),  # decode against a KV cache
    (2, 2, 2, 8, 50, 64, True, [8, 3], [50, 13]),  # chunked prefill
    (1, 2, 1, 19, 40, 64, False, None, None),  # Sq != Skv, no lens
    (1, 1, 1, 20, 20, 128, True, None, None),  # head dim 128
]


@pytest.mark.parametrize(("bsz", "hq", "hkv", "sq", "skv", "d", "causal", "ql", "kl"), CASES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_raw_attention_matches_reference(bsz, hq, hkv, sq, skv, d, causal, ql, kl, dtype):
    _need_kernel()
    if dtype == torch.float16 and d == 128 and _device() == "cpu":
        pytest.skip("one head-dim-128 dtype is enough under the interpreter")
    q, k, v = _inputs(bsz, hq, hkv, sq, skv, d, dtype)
    q_lens, kv_lens = _lens(ql), _lens(kl)
    out, lse = _run_poisoned(q, k, v, causal, None, q_lens, kv_lens)
    ref, ref_lse = reference64(q, k, v, causal, None, q_lens, kv_lens)
    _compare(out, lse, ref, ref_lse, dtype)
    if ql is not None:  # padding rows come back as exact zeros
        for b_i, n in enumerate(ql):
            assert not out[b_i, :, n:].any()
    assert observe.last_implementation("attention") == (
        "triton-interpret" if _device() == "cpu" else "triton"
    )


def test_raw_attention_custom_scale() -> None:
    _need_kernel()
    q, k, v = _inputs(1, 2, 1, 9, 9, 64, torch.float16)
    out, lse = _run_poisoned(q, k, v, True, 0.3, None, None)
    ref, ref_lse = reference64(q, k, v, True, 0.3)
    _compare(out, lse, ref, ref_lse, torch.float16)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("bsz", "hq", "hkv", "sq", "skv", "d", "causal", "ql", "kl"),
    [
        (2, 8, 2, 300, 300, 128, True, None, None),
        (2, 8, 8, 257, 257, 64, False, None, None),
        (3, 8, 2, 200, 200, 128, True, [200, 77, 5], [200, 77, 5]),
        (3, 8, 2, 1, 600, 128, True, [1, 1, 1], [600, 129, 1]),
        (2, 4, 4, 40, 500, 64, True, [40, 17], [500, 300]),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_attention_large(bsz, hq, hkv, sq, skv, d, causal, ql, kl, dtype):
    q, k, v = _inputs(bsz, hq, hkv, sq, skv, d, dtype)
    q_lens, kv_lens = _lens(ql), _lens(kl)
    out, lse = _run_poisoned(q, k, v, causal, None, q_lens, kv_lens)
    ref, ref_lse = reference64(q, k, v, causal, None, q_lens, kv_lens)
    _compare(out, lse, ref, ref_lse, dtype)


@pytest.mark.gpu
def test_gpu_attention_matches_sdpa_at_scale() -> None:
    q, k, v = _inputs(2, 16, 16, 2048, 2048, 128, torch.bfloat16)
    out = raw.attention(q, k, v, causal=True)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), is_causal=True
    )
    assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2


def test_raw_attention_rejects_bad_input() -> None:
    q, k, v = _inputs(2, 4, 2, 8, 8, 64, torch.float16)
    with pytest.raises(raw.GretaInputError, match="argument 'q' has dtype float32"):
        raw.attention(q.float(), k.float(), v.float())
    with pytest.raises(raw.GretaInputError, match="argument 'k' has dtype"):
        raw.attention(q, k.to(torch.bfloat16), v)
    with pytest.raises(raw.GretaInputError, match="argument 'v' has shape"):
        raw.attention(q, k, v[:, :, :4])
    with pytest.raises(raw.GretaInputError, match="argument 'k' has 3 heads"):
        raw.attention(q, k[:, :1].expand(2, 3, 8, 64), v[:, :1].expand(2, 3, 8, 64))
    with pytest.raises(raw.GretaInputError, match="argument 'q' has head dim 32"):
        raw.attention(q[..., :32], k[..., :32], v[..., :32])
    with pytest.raises(raw.GretaInputError, match="argument 'q_lens' has dtype int64"):
        raw.attention(q, k, v, q_lens=torch.tensor([8, 8], device=q.device))
    with pytest.raises(raw.GretaInputError, match="argument 'kv_lens' has shape"):
        raw.attention(q, k, v, kv_lens=torch.tensor([8], dtype=torch.int32, device=q.device))
    with pytest.raises(raw.GretaInputError, match="argument 'q' must have a contiguous last"):
        q_t = torch.randn(2, 4, 64, 8, device=q.device, dtype=q.dtype).transpose(2, 3)
        raw.attention(q_t, k, v)


def test_torch_op_attention_forward_and_opcheck() -> None:
    import greta_core.torch  # noqa: F401

    q, k, v = _inputs(2, 4, 2, 13, 13, 64, torch.bfloat16)
    q_lens = _lens([13, 6])
    out = torch.ops.greta.attention(q, k, v, True, None, q_lens, q_lens)
    ref, ref_lse = reference64(q, k, v, True, None, q_lens, q_lens)
    assert ((out.double().cpu() - ref).norm() / ref.norm()).item() < TOL[torch.bfloat16]
    out2, lse = torch.ops.greta.attention_with_lse(q, k, v, True, None, q_lens, q_lens)
    assert torch.equal(out2, out)
    finite = torch.isfinite(ref_lse)
    assert (lse.double().cpu()[finite] - ref_lse[finite]).abs().max().item() < 1e-3
    # On CPU eager runs the interpreted kernel but tracing decomposes to the reference, whose
    # bf16 rounding differs; fp32 takes the reference both ways. On the GPU both are the kernel.
    if q.device.type == "cpu":
        q, k, v = q.float(), k.float(), v.float()
    torch.library.opcheck(torch.ops.greta.attention.default, (q, k, v, True, None, q_lens, q_lens))
    torch.library.opcheck(torch.ops.greta.attention_with_lse.default, (q, k, v, False))


def test_torch_op_attention_reference_path_and_gradcheck() -> None:
    import greta_core.torch  # noqa: F401

    # float64 has no Triton kernel: the op takes the torch reference, with its backward.
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 5, 8, dtype=torch.float64, generator=gen, requires_grad=True)
    k = torch.randn(2, 2, 7, 8, dtype=torch.float64, generator=gen, requires_grad=True)
    v = torch.randn(2, 2, 7, 8, dtype=torch.float64, generator=gen, requires_grad=True)
    q_lens = torch.tensor([5, 2], dtype=torch.int32)
    kv_lens = torch.tensor([7, 4], dtype=torch.int32)
    out = torch.ops.greta.attention(q, k, v, True, 0.5, q_lens, kv_lens)
    ref, _ = reference64(q.detach(), k.detach(), v.detach(), True, 0.5, q_lens, kv_lens)
    assert torch.allclose(out.detach(), ref, rtol=1e-10, atol=1e-12)
    assert observe.last_implementation("attention") == "reference-torch"
    for causal in (False, True):
        assert torch.autograd.gradcheck(
            lambda a, b, c, causal=causal: torch.ops.greta.attention(
                a, b, c, causal, None, q_lens, kv_lens
            ),
            (q, k, v),
        )


def test_torch_op_attention_backward_on_kernel_dtype() -> None:
    import greta_core.torch  # noqa: F401

    q, k, v = _inputs(1, 2, 1, 6, 6, 64, torch.float16)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    torch.ops.greta.attention(*leaves, True).sum().backward()
    ref_leaves = [t.detach().double().cpu().requires_grad_() for t in (q, k, v)]
    from greta_core.torch.attention import reference

    reference(*ref_leaves, True)[0].sum().backward()
    for mine, theirs in zip(leaves, ref_leaves, strict=True):
        err = ((mine.grad.double().cpu() - theirs.grad).norm() / theirs.grad.norm()).item()
        assert err < 1e-2


# --- backward ------------------------------------------------------------------------------


def _grads64(q, k, v, do, causal, scale=None):
    """dq, dk, dv by float64 autograd through the loop reference above (independent code)."""
    leaves = [t.detach().double().cpu().requires_grad_() for t in (q, k, v)]
    out, _ = reference64(*leaves, causal, scale)
    out.backward(do.double().cpu())
    return [t.grad for t in leaves]


BWD_CASES = [
    # (B, Hq, Hkv, Sq, Skv, D, causal)
    (1, 2, 2, 37, 37, 64, False),
    (1, 2, 2, 70, 70, 64, True),  # two blocks, a ragged second one
    (2, 4, 2, 21, 21, 64, True),  # grouped-query heads: dk/dv summed over the group
    (1, 2, 1, 9, 75, 64, True),  # queries are the last 9 positions (chunked prefill)
    (1, 2, 1, 19, 40, 64, False),
    (1, 1, 1, 20, 20, 128, True),
]


@pytest.mark.parametrize(("bsz", "hq", "hkv", "sq", "skv", "d", "causal"), BWD_CASES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_raw_attention_bwd_matches_reference(bsz, hq, hkv, sq, skv, d, causal, dtype):
    _need_kernel()
    q, k, v = _inputs(bsz, hq, hkv, sq, skv, d, dtype)
    do = torch.randn_like(q)
    out, lse = raw.attention_with_lse(q, k, v, causal)
    dq, dk, dv = raw.attention_bwd(do, q, k, v, out, lse, causal)
    # In the inputs' dtype (no fp32 gradient comes back), dk/dv per KV head.
    assert (dq.dtype, dk.dtype, dv.dtype) == (dtype,) * 3
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
    for got, want in zip((dq, dk, dv), _grads64(q, k, v, do, causal), strict=True):
        err = ((got.double().cpu() - want).norm() / want.norm().clamp_min(1e-30)).item()
        assert err < TOL[dtype]
    assert observe.last_implementation("attention_bwd") == expected_impl()


@pytest.mark.parametrize("block_pointers", [True, False])
def test_attention_bwd_row_store_forms_agree(block_pointers: bool, monkeypatch) -> None:
    """Both forms of the backward's row store (block pointer through Triton 3.8, masked
    pointers from 3.9, which removed block pointers) write the same gradients, ragged
    last block included; only the installed Triton's own form compiles on a GPU."""
    import triton
    import triton.language as tl

    from greta_core.kernels import attention_bwd
    from greta_install import triton_range

    _need_kernel()
    if ON_GPU:  # compiled code: only the installed Triton's own form compiles
        block_pointers = triton_range.has_block_pointers(triton.__version__)
    monkeypatch.setattr(attention_bwd, "BLOCK_POINTER_STORE", tl.constexpr(block_pointers))
    q, k, v = _inputs(1, 2, 1, 19, 40, 64, torch.float16)
    do = torch.randn_like(q)
    out, lse = raw.attention_with_lse(q, k, v, False)
    for got, want in zip(
        raw.attention_bwd(do, q, k, v, out, lse, False),
        _grads64(q, k, v, do, False),
        strict=True,
    ):
        err = ((got.double().cpu() - want).norm() / want.norm().clamp_min(1e-30)).item()
        assert err < TOL[torch.float16]


def test_raw_attention_bwd_rejects_bad_input() -> None:
    _need_kernel()
    q, k, v = _inputs(1, 2, 1, 8, 8, 64, torch.float16)
    out, lse = raw.attention_with_lse(q, k, v, True)
    with pytest.raises(raw.GretaInputError, match="'do' must be shaped like q"):
        raw.attention_bwd(q[:, :1], q, k, v, out, lse)
    with pytest.raises(raw.GretaInputError, match="'lse' has shape"):
        raw.attention_bwd(q, q, k, v, out, lse[:, :1])
    with pytest.raises(raw.GretaInputError, match="'lse' has dtype"):
        raw.attention_bwd(q, q, k, v, out, lse.double())


@pytest.mark.parametrize("causal", [False, True])
def test_torch_op_backward_runs_the_triton_kernels(causal: bool) -> None:
    """torch.ops.greta.attention's autograd takes the Triton backward (no lengths, fp16/bf16)."""
    import greta_core.torch  # noqa: F401

    _need_kernel()
    q, k, v = _inputs(1, 4, 2, 33, 33, 64, torch.bfloat16)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    do = torch.randn_like(q)
    torch.ops.greta.attention(*leaves, causal).backward(do)
    assert observe.last_implementation("attention_bwd") == expected_impl()
    for mine, want in zip(leaves, _grads64(q, k, v, do, causal), strict=True):
        err = ((mine.grad.double().cpu() - want).norm() / want.norm()).item()
        assert err < TOL[torch.bfloat16]


def test_torch_op_backward_reuses_the_forward_logsumexp(monkeypatch: pytest.MonkeyPatch) -> None:
    """One forward kernel per training step: the backward takes the saved output and
    logsumexp instead of running the forward again."""
    import greta_core.torch  # noqa: F401
    from greta_core.ops.attention_bwd import ATTENTION_BWD

    _need_kernel()
    calls = {"fwd": 0, "bwd": 0}
    depth = [0]
    # Every binding runs the declarations' call caches (`run`; the eager training path's
    # ready launch, `launch_args`, else `launch`): count the plans they run.
    for key, call in (("fwd", attn_ops.ATTENTION.call_stats), ("bwd", ATTENTION_BWD.call)):
        for method in ("run", "launch", "launch_args"):
            counted = _counting(calls, key, getattr(call, method), depth)
            monkeypatch.setattr(call, method, counted)
    q, k, v = _inputs(1, 2, 2, 17, 17, 64, torch.bfloat16)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    do = torch.randn_like(q)
    torch.ops.greta.attention(*leaves, True).backward(do)
    assert calls == {"fwd": 1, "bwd": 1}
    for mine, want in zip(leaves, _grads64(q, k, v, do, True), strict=True):
        err = ((mine.grad.double().cpu() - want).norm() / want.norm()).item()
        assert err < TOL[torch.bfloat16]


def _counting(calls: dict[str, int], key: str, fn: Any, depth: list[int]) -> Any:
    """`fn`, counting the outermost calls that ran a plan: the eager paths call the ready
    launch (`launch_args`, None when there is none) and then `launch`, which may look for
    the ready launch again itself."""

    def counted(*a: Any, **kw: Any) -> Any:
        depth[0] += 1
        try:
            out = fn(*a, **kw)
        finally:
            depth[0] -= 1
        if depth[0] == 0 and out is not None:
            calls[key] += 1
        return out

    return counted


def _needs_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("the eager training path takes GPU tensors only (CPU calls take the torch op)")


def _backward_name(out: torch.Tensor) -> str:
    return type(out.grad_fn).__name__


def test_cpu_training_takes_the_torch_ops_autograd() -> None:
    import greta_core.torch  # noqa: F401

    q, k, v = (torch.randn(1, 2, 5, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    out = torch.ops.greta.attention(q, k, v, True)
    assert "eager" not in _backward_name(out)
    out.float().sum().backward()
    assert q.grad is not None and k.grad is not None


@pytest.mark.parametrize(
    ("hq", "hkv", "d", "causal"), [(4, 4, 64, True), (8, 2, 128, True), (4, 2, 64, False)]
)
def test_gpu_eager_training_matches_the_torch_ops_autograd_bit_for_bit(
    hq: int, hkv: int, d: int, causal: bool
) -> None:
    """Eager training takes the plain autograd.Function (not torch.library's wrapper) and runs
    the same kernels: output and gradients equal those of attention_with_lse's autograd."""
    import greta_core.torch  # noqa: F401

    _needs_cuda()
    q, k, v = _inputs(2, hq, hkv, 130, 130, d, torch.bfloat16)
    do = torch.randn_like(q)
    fast = [t.clone().requires_grad_() for t in (q, k, v)]
    out = torch.ops.greta.attention(*fast, causal)
    assert _backward_name(out) == "greta_attention_fwd_eagerBackward"
    out.backward(do)
    assert observe.last_implementation("attention_bwd") == "triton"
    slow = [t.clone().requires_grad_() for t in (q, k, v)]
    want = torch.ops.greta.attention_with_lse(*slow, causal)[0]
    assert "eager" not in _backward_name(want)
    want.backward(do)
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    for mine, theirs in zip(fast, slow, strict=True):
        assert mine.grad.shape == theirs.grad.shape
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=0, atol=0)
    for mine, exact in zip(fast, _grads64(q, k, v, do, causal), strict=True):
        err = ((mine.grad.double().cpu() - exact).norm() / exact.norm()).item()
        assert err < TOL[torch.bfloat16]


def test_gpu_eager_training_leaves_modes_lengths_and_double_backward_to_torch() -> None:
    """A dispatch mode takes the torch op's autograd; per-batch lengths take the eager
    path with the reference backward; the eager path's gradients carry no graph (its
    backward is the Triton kernels), so a second derivative is refused by autograd rather
    than silently wrong."""
    import greta_core.torch  # noqa: F401

    _needs_cuda()
    q, k, v = (t.requires_grad_() for t in _inputs(1, 2, 2, 40, 40, 64, torch.bfloat16))

    with PassthroughMode():
        assert "eager" not in _backward_name(torch.ops.greta.attention(q, k, v, True))
    lens = torch.tensor([30], dtype=torch.int32, device=q.device)
    with_lens = torch.ops.greta.attention(q, k, v, True, None, lens, lens)
    assert _backward_name(with_lens) == "greta_attention_fwd_eagerBackward"
    with_lens.float().sum().backward()
    assert observe.last_implementation("attention_bwd") == "reference-torch"
    q.grad = k.grad = v.grad = None
    out = torch.ops.greta.attention(q, k, v, True)
    (dq,) = torch.autograd.grad(out.float().sum(), q, create_graph=True)
    assert dq.grad_fn is None and not dq.requires_grad
    with pytest.raises(RuntimeError, match="does not require grad"):
        torch.autograd.grad(dq.float().sum(), q)


@pytest.mark.gpu
@pytest.mark.parametrize(("hkv", "d"), [(8, 128), (2, 128), (2, 64)])  # MHA; GQA groups of 4
def test_gpu_attention_bwd_matches_sdpa_at_scale(hkv: int, d: int) -> None:
    """The table's tiles on the GPU: dk/dv summed over each group of query heads (SDPA on fp32
    copies with k, v repeated per query head), every gradient in bf16 shaped like its input."""
    import greta_core.torch  # noqa: F401

    q = torch.randn(2, 8, 1024, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, hkv, 1024, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    do = torch.randn_like(q)
    group = 8 // hkv
    grads = []
    for fn in (
        lambda a, b, c: torch.ops.greta.attention(a, b, c, True),
        lambda a, b, c: torch.nn.functional.scaled_dot_product_attention(
            a.float(),
            b.float().repeat_interleave(group, 1),
            c.float().repeat_interleave(group, 1),
            is_causal=True,
        ),
    ):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        fn(*leaves).backward(do.to(fn(*leaves).dtype))
        grads.append([t.grad for t in leaves])
    for mine, theirs, leaf in zip(*grads, (q, k, v), strict=True):
        assert (mine.dtype, mine.shape) == (torch.bfloat16, leaf.shape)
        assert ((mine.float() - theirs).norm() / theirs.norm()).item() < 2e-2


def test_jax_attention_matches_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    # jax-triton sets TRITON_CACHE_DIR="" on import; restore it for later torch tests.
    monkeypatch.setenv("TRITON_CACHE_DIR", os.environ.get("TRITON_CACHE_DIR", ""))
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    import numpy as np

    from greta_core import jax as gjax

    q, k, v = (t.cpu() for t in _inputs(2, 4, 2, 11, 11, 64, torch.float16))
    ql = [11, 4]
    ref, ref_lse = reference64(q, k, v, True, None, ql, ql)
    lens = jnp.asarray(ql, jnp.int32)
    out, lse = gjax.attention_with_lse(
        *(jnp.asarray(t.numpy()) for t in (q, k, v)), causal=True, q_lens=lens, kv_lens=lens
    )
    out64 = np.asarray(out, np.float64)
    assert np.linalg.norm(out64 - ref.numpy()) / np.linalg.norm(ref.numpy()) < 2e-3
    finite = np.isfinite(ref_lse.numpy())
    np.testing.assert_array_equal(np.isfinite(np.asarray(lse)), finite)
    np.testing.assert_allclose(np.asarray(lse)[finite], ref_lse.numpy()[finite], atol=1e-3)
    assert observe.last_implementation("attention") == expected_jax_impl()
    with pytest.raises(ValueError, match="argument 'k' has 3 heads"):
        gjax.attention(jnp.zeros((1, 4, 2, 64)), jnp.zeros((1, 3, 2, 64)), jnp.zeros((1, 3, 2, 64)))


@pytest.mark.parametrize("causal", [False, True])
def test_jax_attention_grad_matches_reference(
    causal: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """jax.grad through greta_core.jax.attention: the Triton backward (custom_vjp) on a GPU,
    JAX's autodiff of the jnp reference elsewhere; float64 loop reference either way."""
    monkeypatch.setenv("TRITON_CACHE_DIR", os.environ.get("TRITON_CACHE_DIR", ""))
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    import numpy as np

    from greta_core import jax as gjax

    q, k, v = (t.cpu() for t in _inputs(1, 4, 2, 40, 40, 64, torch.bfloat16))
    do = torch.randn_like(q)
    want = _grads64(q, k, v, do, causal)
    jq, jk, jv, jdo = (jnp.asarray(t.float().numpy()).astype(jnp.bfloat16) for t in (q, k, v, do))

    def loss(a, b, c):
        return jnp.sum(
            gjax.attention(a, b, c, causal).astype(jnp.float32) * jdo.astype(jnp.float32)
        )

    grads = jax.grad(loss, argnums=(0, 1, 2))(jq, jk, jv)
    for got, ref in zip(grads, want, strict=True):
        got64 = np.asarray(got.astype(jnp.float32), np.float64)
        assert (
            np.linalg.norm(got64 - ref.numpy()) / np.linalg.norm(ref.numpy()) < TOL[torch.bfloat16]
        )
    if jax.default_backend() == "gpu":
        assert observe.last_implementation("attention_bwd") == "jax-triton"


@pytest.mark.parametrize("arch", ["sm_90", "gfx942", "gfx1100", "gfx1201", "default"])
def test_attention_aot_specs_cover_the_kernel_signature(arch: str) -> None:
    from greta_core.kernels import attention as kernel
    from greta_core.ops.attention import ATTENTION
    from greta_core.ops.declare import aot_specs

    specs = aot_specs(ATTENTION, arch)
    # dtypes x head dims x (GQA, MHA) x (prefill, decode); the raw API's lengths: first use
    assert len(specs) == 2 * 2 * 2 * 2
    for spec in specs:
        assert spec.uses_matrix_units
        assert {*spec.signature, *spec.constexprs} == set(kernel.attention_fwd_kernel.arg_names)
        assert spec.signature["lse_ptr"] == "*fp32"
        assert ("waves_per_eu" in spec.options) == (arch == "gfx942")
        # Every int the JIT specialises on divisibility (not the constant 1, not the lengths
        # and head counts: kernel.UNALIGNED_INTS), with its divisibility.
        ints = {n for n, t in spec.signature.items() if t == "i32"}
        assert set(spec.int_divisible) == ints - set(kernel.UNALIGNED_INTS)
        assert spec.constexprs["HAS_LENS"] is False
        # Strides are multiples of the head dim; a decode's one query is the constant 1.
        assert all(spec.int_divisible[n] for n in ints if n.startswith("stride_"))
        assert (spec.constexprs.get("Sq") == 1) == (spec.constexprs["BLOCK_M"] == 16)


@pytest.mark.parametrize("arch", ["sm_90", "gfx942", "gfx1100", "gfx1201", "default"])
def test_attention_bwd_aot_specs_cover_every_planned_launch(arch: str) -> None:
    """Each launch the backward's plan makes (delta, then dkdv and dq) at the table's tiles
    for a causal bf16 training call is an AOT spec: same kernel, constexprs and options."""
    from greta_core.kernels import attention_bwd as kernel
    from greta_core.ops import attention_bwd as bwd_ops
    from greta_core.ops.declare import aot_specs

    specs = aot_specs(bwd_ops.ATTENTION_BWD, arch)
    # head dims x query lengths (16-divisible or not) x (delta, dkdv, dq): the head counts
    # and the key length are not specialised on divisibility (kernel.UNALIGNED_INTS)
    assert len(specs) == 2 * 2 * 3
    for spec in specs:
        assert "Sq" in spec.int_divisible
        assert not set(spec.int_divisible) & set(kernel.UNALIGNED_INTS)
    compiled = {
        (spec.kernel, tuple(sorted(spec.constexprs.items())), tuple(sorted(spec.options.items())))
        for spec in specs
    }
    for spec in specs:
        names = spec.kernel.arg_names
        assert {*spec.signature, *spec.constexprs} == set(names)
        assert spec.uses_matrix_units == (spec.kernel is not kernel.attention_bwd_delta_kernel)
        # The gradients are stored in the inputs' dtype, not fp32.
        for out in ("dq_ptr", "dk_ptr", "dv_ptr"):
            if out in spec.signature:
                assert spec.signature[out] == spec.signature["q_ptr"] == "*bf16", spec.name
    for d in (64, 128):
        plan = bwd_ops.plan(
            (2, 8, 256, d), (2, 256), ((1, 1, 1),) * 5, "bfloat16", True, None, arch
        )
        assert len(plan.launches) == 3
        for launch in plan.launches:
            key = (
                launch.kernel,
                tuple(sorted(launch.constexprs.items())),
                tuple(sorted(launch.options.items())),
            )
            assert any(
                k[0] is key[0] and set(key[1]) <= set(k[1]) and k[2] == key[2] for k in compiled
            ), f"{arch} D{d}: {launch.kernel.__name__} not compiled"
