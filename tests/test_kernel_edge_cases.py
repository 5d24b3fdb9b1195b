"""Edge cases shared by every path (raw Triton, torch ops, JAX): NaN propagation, lengths,
int64 capacities, empty key sets, dtype rules, broadcast caches (issue 11, item 13)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from _kernel_testing import DEVICE, ON_GPU, need_triton  # noqa: E402

import greta_core.torch  # noqa: E402, F401
from greta_core import raw  # noqa: E402
from greta_core.errors import GretaError, GretaInputError  # noqa: E402


def _qkv(dtype: torch.dtype, seq: int = 4, device: str = DEVICE) -> tuple:
    gen = torch.Generator().manual_seed(0)
    shape = (1, 2, seq, 64)
    return tuple(torch.randn(shape, generator=gen).to(device=device, dtype=dtype) for _ in "qkv")


def _sdpa_nan_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    out = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double())
    return out.isnan().any(-1)


# --- NaN in, NaN out ------------------------------------------------------------------------


def test_attention_reference_propagates_nan_like_sdpa() -> None:
    q, k, v = _qkv(torch.float32, device="cpu")
    q[0, 1, 2, 5] = float("nan")
    out = torch.ops.greta.attention(q, k, v)  # float32 on the CPU: the torch reference
    want = _sdpa_nan_rows(q, k, v)
    assert want.any() and not want.all()
    assert torch.equal(out.isnan().any(-1), want)


def test_attention_kernel_propagates_nan_like_sdpa() -> None:
    need_triton()
    q, k, v = _qkv(torch.float16)
    k[0, 0, 1, 3] = float("nan")  # every row of head 0 sees key 1
    out = raw.attention(q, k, v)
    assert torch.equal(out.isnan().any(-1).cpu(), _sdpa_nan_rows(q.cpu(), k.cpu(), v.cpu()))


def test_attention_rows_without_keys_stay_zero() -> None:
    # The other half of the rule: a padding row (sees no key) is zeros, not NaN.
    q, k, v = _qkv(torch.float32, device="cpu")
    lens = torch.tensor([2], dtype=torch.int32)
    out = torch.ops.greta.attention(q, k, v, False, None, lens, None)
    assert torch.equal(out[:, :, 2:], torch.zeros_like(out[:, :, 2:]))
    assert not out.isnan().any()


def test_jax_attention_reference_propagates_nan() -> None:
    jnp = pytest.importorskip("jax.numpy")
    from greta_core.jax._attention import reference

    q, k, v = (jnp.asarray(t.numpy()) for t in _qkv(torch.float32, device="cpu"))
    q = q.at[0, 1, 2, 5].set(jnp.nan)
    out, _ = reference(q, k, v)
    rows = jnp.isnan(out).any(-1)
    assert bool(rows[0, 1, 2]) and int(rows.sum()) == 1


# --- lengths --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["q_lens", "kv_lens"])
def test_attention_negative_lengths_refused(name: str) -> None:
    q, k, v = _qkv(torch.float32, device="cpu")
    lens = {name: torch.tensor([-1], dtype=torch.int32)}
    with pytest.raises(GretaInputError, match=f"argument '{name}' holds a negative length"):
        torch.ops.greta.attention(q, k, v, False, None, lens.get("q_lens"), lens.get("kv_lens"))


def test_raw_attention_negative_lengths_refused() -> None:
    need_triton()
    if ON_GPU:
        pytest.skip("a GPU tensor's lengths are not read on the host (the kernel clamps them)")
    q, k, v = _qkv(torch.float16)
    with pytest.raises(GretaInputError, match="negative length"):
        raw.attention(q, k, v, kv_lens=torch.tensor([-3], dtype=torch.int32))


def test_jax_attention_negative_lengths_refused() -> None:
    jnp = pytest.importorskip("jax.numpy")
    from greta_core import jax as gj

    q, k, v = (jnp.asarray(t.numpy()) for t in _qkv(torch.float32, device="cpu"))
    with pytest.raises(GretaInputError, match="argument 'q_lens' holds a negative length"):
        gj.attention(q, k, v, q_lens=jnp.asarray([-2], dtype=jnp.int32))


# --- JAX: empty key set, int64 capacities ----------------------------------------------------


def test_jax_attention_without_keys_gives_zeros() -> None:
    jnp = pytest.importorskip("jax.numpy")
    from greta_core import jax as gj

    q = jnp.ones((1, 2, 3, 64), jnp.float32)
    kv = jnp.ones((1, 2, 0, 64), jnp.float32)
    out, lse = gj.attention_with_lse(q, kv, kv)
    assert out.shape == q.shape and not bool(jnp.any(out != 0))
    assert bool(jnp.all(jnp.isneginf(lse)))


def test_jax_kv_cache_capacity_check_does_not_wrap_int32() -> None:
    jnp = pytest.importorskip("jax.numpy")
    from greta_core import jax as gj

    cache = jnp.zeros((1, 1, 8, 4), jnp.float32)
    new = jnp.ones((1, 1, 4, 4), jnp.float32)
    lens = jnp.asarray([2**31 - 2], dtype=jnp.int32)  # + 4 tokens wraps in int32
    with pytest.raises(GretaInputError, match="overflows max_seq"):
        gj.kv_cache_append(cache, cache, new, new, lens)


def test_raw_kv_cache_positions_do_not_wrap_int32() -> None:
    # Unchecked (as on a GPU): a length near 2**31 must drop the tokens, not wrap to a
    # small (or negative) position and write there.
    need_triton()
    kc = torch.zeros(1, 1, 8, 16, device=DEVICE)
    vc = torch.zeros_like(kc)
    new = torch.ones(1, 1, 4, 16, device=DEVICE)
    lens = torch.tensor([2**31 - 2], dtype=torch.int32, device=DEVICE)
    raw.kv_cache_append(kc, vc, new, new, lens, check=False)
    assert not kc.any() and not vc.any()


# --- one dtype rule on every path -------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool])
def test_torch_ops_refuse_integer_dtypes_on_cpu(dtype: torch.dtype) -> None:
    a = torch.ones(4, 4, dtype=dtype)
    with pytest.raises(GretaInputError, match="argument 'a' has dtype"):
        torch.ops.greta.matmul(a, a)
    q = torch.ones(1, 1, 2, 64, dtype=dtype)
    with pytest.raises(GretaInputError, match="argument 'q' has dtype"):
        torch.ops.greta.attention(q, q, q)


@pytest.mark.gpu
def test_torch_ops_take_float64_on_gpu_like_on_cpu() -> None:
    if not ON_GPU:
        pytest.skip("GPU test: no CUDA/ROCm GPU visible to torch")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 8, generator=gen, dtype=torch.float64)
    w = torch.randn(8, generator=gen, dtype=torch.float64)
    cpu = torch.ops.greta.rms_norm(x, w, 1e-6)
    gpu = torch.ops.greta.rms_norm(x.cuda(), w.cuda(), 1e-6)
    torch.testing.assert_close(gpu.cpu(), cpu)
    a = torch.randn(4, 4, generator=gen, dtype=torch.float32)
    torch.testing.assert_close(torch.ops.greta.matmul(a.cuda(), a.cuda()).cpu(), a @ a)


# --- a broadcast (stride-0) cache -------------------------------------------------------------


def test_kv_cache_refuses_a_broadcast_cache() -> None:
    base = torch.zeros(1, 1, 1, 16)
    kc = base.expand(2, 2, 8, 16)  # every (b, h, s) row is one memory slot
    vc = torch.zeros(2, 2, 8, 16)
    new = torch.ones(2, 2, 1, 16)
    lens = torch.zeros(2, dtype=torch.int32)
    with pytest.raises(GretaInputError, match="argument 'k_cache' has a zero stride"):
        torch.ops.greta.kv_cache_append(kc, vc, new, new, lens)
    assert not base.any()


def test_raw_kv_cache_refuses_a_broadcast_cache() -> None:
    need_triton()
    base = torch.zeros(1, 1, 8, 16, device=DEVICE)
    vc = base.expand(2, 2, 8, 16)
    kc = torch.zeros(2, 2, 8, 16, device=DEVICE)
    new = torch.ones(2, 2, 1, 16, device=DEVICE)
    lens = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    with pytest.raises(GretaInputError, match="argument 'v_cache' has a zero stride"):
        raw.kv_cache_append(kc, vc, new, new, lens)
    assert not base.any()


def test_input_errors_are_greta_errors() -> None:
    assert issubclass(GretaInputError, GretaError) and issubclass(GretaInputError, ValueError)
    assert raw.GretaInputError is GretaInputError
