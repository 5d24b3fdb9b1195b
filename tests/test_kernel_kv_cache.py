"""KV-cache append: raw kernel (in place), torch op (mutation), JAX (functional)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from _kernel_testing import DEVICE, DTYPES, ON_GPU, expected_impl, need_triton  # noqa: E402

import greta_core.torch  # noqa: E402, F401
from greta_core import observe, raw  # noqa: E402


def _case(dtype, batch=3, heads=2, max_seq=11, d=24, new=3):
    kc = torch.randn(batch, heads, max_seq, d, device=DEVICE).to(dtype)
    vc = torch.randn(batch, heads, max_seq, d, device=DEVICE).to(dtype)
    k = torch.randn(batch, heads, new, d, device=DEVICE).to(dtype)
    v = torch.randn(batch, heads, new, d, device=DEVICE).to(dtype)
    lens = torch.randint(0, max_seq - new + 1, (batch,), dtype=torch.int32, device=DEVICE)
    return kc, vc, k, v, lens


def _expected(kc, vc, k, v, lens):
    kc, vc = kc.clone(), vc.clone()
    for b, n in enumerate(lens.tolist()):
        kc[b, :, n : n + k.shape[2]] = k[b]
        vc[b, :, n : n + k.shape[2]] = v[b]
    return kc, vc


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("new", [1, 3] + ([130] if ON_GPU else []))
def test_raw_kv_cache_append(dtype, new) -> None:
    need_triton()
    kc, vc, k, v, lens = _case(dtype, new=new, max_seq=max(11, new + 4))
    want_k, want_v = _expected(kc, vc, k, v, lens)
    new_lens = raw.kv_cache_append(kc, vc, k, v, lens, check=True)
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)  # a copy: exact
    assert torch.equal(new_lens, lens + new)
    assert observe.last_implementation("kv_cache_append") == expected_impl()


def test_raw_kv_cache_strided_new_tokens() -> None:
    need_triton()
    kc, vc, _, _, lens = _case(torch.float32)
    kv = torch.randn(3, 3, 2, 2, 24, device=DEVICE)  # [B, T, 2, H, D] -> strided views
    k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
    want_k, want_v = _expected(kc, vc, k, v, lens)
    raw.kv_cache_append(kc, vc, k, v, lens)
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)


def test_kv_cache_overflow_and_bad_input() -> None:
    kc, vc, k, v, _ = _case(torch.float32)
    full = torch.tensor([0, 9, 2], dtype=torch.int32, device=DEVICE)
    with pytest.raises(raw.GretaInputError, match="overflows max_seq 11"):
        raw.kv_cache_append(kc, vc, k, v, full, check=True)
    with pytest.raises(raw.GretaInputError, match="overflows max_seq 11"):
        torch.ops.greta.kv_cache_append(kc.cpu(), vc.cpu(), k.cpu(), v.cpu(), full.cpu())
    lens = torch.zeros(3, dtype=torch.int32, device=DEVICE)
    with pytest.raises(raw.GretaInputError, match="argument 'cache_lens' has dtype"):
        raw.kv_cache_append(kc, vc, k, v, lens.long())
    with pytest.raises(raw.GretaInputError, match="argument 'v' has dtype"):
        raw.kv_cache_append(kc, vc, k, v.half(), lens)
    with pytest.raises(raw.GretaInputError, match="argument 'k' has shape"):
        raw.kv_cache_append(kc, vc, k[:, :1], v, lens)


@pytest.mark.gpu
def test_kv_cache_overflow_is_dropped_not_written_on_gpu() -> None:
    kc, vc, k, v, _ = _case(torch.float32)
    lens = torch.tensor([10, 0, 0], dtype=torch.int32, device=DEVICE)  # item 0 overflows by 2
    before = kc.clone()
    raw.kv_cache_append(kc, vc, k, v, lens)  # no host check on the GPU by default
    assert torch.equal(kc[0, :, 10], k[0, :, 0]) and torch.equal(kc[0, :, :10], before[0, :, :10])


def test_torch_kv_cache_append_op() -> None:
    kc, vc, k, v, lens = _case(torch.float16)
    want_k, want_v = _expected(kc, vc, k, v, lens)
    new_lens = torch.ops.greta.kv_cache_append(kc, vc, k, v, lens)
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)
    assert torch.equal(new_lens, lens + 3)
    kc, vc, k, v, lens = _case(torch.float32)
    torch.library.opcheck(torch.ops.greta.kv_cache_append.default, (kc, vc, k, v, lens))


def test_jax_kv_cache_append() -> None:
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    import numpy as np

    from greta_core import jax as gj

    kc, vc, k, v, lens = (t.cpu() for t in _case(torch.float32))
    want_k, want_v = _expected(kc, vc, k, v, lens)
    arrays = [jnp.asarray(t.numpy()) for t in (kc, vc, k, v, lens)]
    out_k, out_v, new_lens = gj.kv_cache_append(*arrays)
    assert np.array_equal(np.asarray(out_k), want_k.numpy())
    assert np.array_equal(np.asarray(out_v), want_v.numpy())
    assert np.array_equal(np.asarray(new_lens), (lens + 3).numpy())
    jitted = jax.jit(gj.kv_cache_append)(*arrays)  # traced lens: no host check, still correct
    assert np.array_equal(np.asarray(jitted[0]), want_k.numpy())
    with pytest.raises(raw.GretaInputError, match="overflows max_seq"):
        gj.kv_cache_append(*arrays[:4], jnp.asarray([0, 10, 0], dtype=jnp.int32))
