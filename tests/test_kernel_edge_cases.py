"""Edge cases shared by every path (raw Triton, torch ops, JAX): NaN propagation, lengths,
int64 capacities, empty key sets, dtype rules, broadcast caches (issue 11, item 13)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from _kernel_testing import DEVICE, ON_GPU, need_triton  # noqa: E402

import greta_core.torch  # noqa: E402, F401
from greta_core import raw  # noqa: E402


@contextlib.contextmanager
def raises_input_error(match: str) -> Iterator[pytest.ExceptionInfo]:
    """pytest.raises(GretaInputError, match=...), the message checked before the type: the
    type came with issue 11 (greta_core.errors), so against older code these tests fail at
    the behaviour (no error, another message), not at an import (scripts/failed_before.sh)."""
    with pytest.raises(ValueError, match=match) as err:
        yield err
    from greta_core.errors import GretaInputError

    assert isinstance(err.value, GretaInputError), type(err.value)


def _qkv(dtype: torch.dtype, seq: int = 4, device: str = DEVICE) -> tuple:
    gen = torch.Generator().manual_seed(0)
    shape = (1, 2, seq, 64)
    return tuple(torch.randn(shape, generator=gen).to(device=device, dtype=dtype) for _ in "qkv")


def _nan_rows(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
    q_len: int | None = None, kv_len: int | None = None,
) -> torch.Tensor:  # fmt: skip
    """Which rows of softmax(q k^T / sqrt(d)) v hold a NaN, from the definition in float64
    with plain ops (no SDPA backend to differ between torch versions): query row i < q_len
    sees keys j < kv_len, and j <= kv_len - q_len + i when causal; a row that sees no key
    is zeros."""
    q, k, v = (t.detach().cpu().double() for t in (q, k, v))
    batch, heads, seq_q, dim = q.shape
    q_len = seq_q if q_len is None else q_len
    kv_len = k.shape[2] if kv_len is None else kv_len
    rows = torch.zeros(batch, heads, seq_q, dtype=torch.bool)
    for b in range(batch):
        for h in range(heads):
            for i in range(q_len):
                keys = [j for j in range(kv_len) if not causal or j <= kv_len - q_len + i]
                if keys:
                    p = torch.softmax(q[b, h, i] @ k[b, h, keys].T / math.sqrt(dim), -1)
                    rows[b, h, i] = (p @ v[b, h, keys]).isnan().any()
    return rows


# (which input, where the NaN goes, causal, q_len, kv_len). Each leaves some rows finite:
# a NaN reaches exactly the rows that see it (its own query row, or a visible key).
NAN_CASES = [
    pytest.param("q", (0, 1, 2, 5), False, None, None, id="q"),
    pytest.param("q", (0, 1, 2, 5), True, None, None, id="q-causal"),
    pytest.param("k", (0, 0, 1, 3), False, None, None, id="k"),  # every row of head 0
    pytest.param("k", (0, 0, 1, 3), True, None, None, id="k-causal"),  # not row 0
    pytest.param("v", (0, 0, 1, 3), False, None, None, id="v"),
    pytest.param("v", (0, 0, 1, 3), True, None, None, id="v-causal"),  # not row 0
    pytest.param("v", (0, 0, 3, 0), False, 2, 4, id="v-lens"),  # rows 2, 3 see no key
]


def _nan_inputs(
    dtype: torch.dtype, device: str, which: str, where: tuple[int, ...], causal: bool,
    q_len: int | None, kv_len: int | None,
) -> tuple[tuple, dict, torch.Tensor]:  # fmt: skip
    q, k, v = _qkv(dtype, device=device)
    {"q": q, "k": k, "v": v}[which][where] = float("nan")
    lens = {
        "q_lens": None if q_len is None else torch.tensor([q_len], dtype=torch.int32),
        "kv_lens": None if kv_len is None else torch.tensor([kv_len], dtype=torch.int32),
    }
    want = _nan_rows(q, k, v, causal, q_len, kv_len)
    assert want.any() and not want.all()
    return (q, k, v), lens, want


def _assert_nan_rule(out: torch.Tensor, want: torch.Tensor, q_len: int | None) -> None:
    out = out.cpu()
    assert torch.equal(out.isnan().any(-1), want)
    if q_len is not None:  # rows that see no key are zeros, NaN in v or not
        assert torch.equal(out[:, :, q_len:], torch.zeros_like(out[:, :, q_len:]))


# --- NaN in, NaN out ------------------------------------------------------------------------


@pytest.mark.parametrize(("which", "where", "causal", "q_len", "kv_len"), NAN_CASES)
def test_attention_reference_propagates_nan_like_sdpa(
    which: str, where: tuple[int, ...], causal: bool, q_len: int | None, kv_len: int | None
) -> None:
    (q, k, v), lens, want = _nan_inputs(torch.float32, "cpu", which, where, causal, q_len, kv_len)
    # float32 on the CPU: the torch reference
    out = torch.ops.greta.attention(q, k, v, causal, None, lens["q_lens"], lens["kv_lens"])
    _assert_nan_rule(out, want, q_len)


@pytest.mark.parametrize(("which", "where", "causal", "q_len", "kv_len"), NAN_CASES)
def test_attention_kernel_propagates_nan_like_sdpa(
    which: str, where: tuple[int, ...], causal: bool, q_len: int | None, kv_len: int | None
) -> None:
    need_triton()
    (q, k, v), lens, want = _nan_inputs(torch.float16, DEVICE, which, where, causal, q_len, kv_len)
    lens = {n: t if t is None else t.to(DEVICE) for n, t in lens.items()}
    _assert_nan_rule(raw.attention(q, k, v, causal=causal, **lens), want, q_len)


@pytest.mark.parametrize(
    ("keys", "q_len", "kv_len"),
    [
        pytest.param((70,), None, None, id="one-key"),  # masked for rows 64-127, whole later
        pytest.param((5, 130), None, None, id="two-keys"),
        pytest.param((100, 145), 90, 140, id="lens"),  # key 145 is past kv_len: never seen
    ],
)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("tiles", [None, (32, 64)], ids=["table", "block_n>block_m"])
def test_attention_kernel_nan_in_v_across_blocks(
    keys: tuple[int, ...], q_len: int | None, kv_len: int | None, dtype: torch.dtype,
    tiles: tuple[int, int] | None,
) -> None:  # fmt: skip
    """Causal, several key blocks: a NaN value reaches exactly the rows that see its key,
    whether the key falls in a block every row of a tile sees, on the diagonal, or past the
    last key a tile's rows see (a key block wider than the query block loads it)."""
    from greta_core import configs

    need_triton()
    q, k, v = _qkv(dtype, seq=150)
    for key in keys:
        v[0, 0, key, 9] = float("nan")
    lens = {
        "q_lens": None if q_len is None else torch.tensor([q_len], dtype=torch.int32),
        "kv_lens": None if kv_len is None else torch.tensor([kv_len], dtype=torch.int32),
    }
    want = _nan_rows(q, k, v, True, q_len, kv_len)
    assert want.any() and not want.all()
    lens = {n: t if t is None else t.to(DEVICE) for n, t in lens.items()}
    over = {} if tiles is None else {"attention": {"BLOCK_M": tiles[0], "BLOCK_N": tiles[1]}}
    with configs.Override(over):
        out = raw.attention(q, k, v, causal=True, **lens)
    _assert_nan_rule(out, want, q_len)


def test_attention_rows_without_keys_stay_zero() -> None:
    # The other half of the rule: a padding row (sees no key) is zeros, not NaN.
    q, k, v = _qkv(torch.float32, device="cpu")
    lens = torch.tensor([2], dtype=torch.int32)
    out = torch.ops.greta.attention(q, k, v, False, None, lens, None)
    assert torch.equal(out[:, :, 2:], torch.zeros_like(out[:, :, 2:]))
    assert not out.isnan().any()


@pytest.mark.parametrize(("which", "where", "causal", "q_len", "kv_len"), NAN_CASES)
def test_jax_attention_reference_propagates_nan(
    which: str, where: tuple[int, ...], causal: bool, q_len: int | None, kv_len: int | None
) -> None:
    jnp = pytest.importorskip("jax.numpy")
    import numpy as np

    from greta_core.reference import attention_with_lse as reference

    (q, k, v), lens, want = _nan_inputs(torch.float32, "cpu", which, where, causal, q_len, kv_len)
    jl = {n: None if t is None else jnp.asarray(t.numpy()) for n, t in lens.items()}
    out, _ = reference(*(jnp.asarray(t.numpy()) for t in (q, k, v)), causal, None, **jl)
    _assert_nan_rule(torch.from_numpy(np.array(out)), want, q_len)


# --- lengths --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["q_lens", "kv_lens"])
def test_attention_negative_lengths_refused(name: str) -> None:
    q, k, v = _qkv(torch.float32, device="cpu")
    lens = {name: torch.tensor([-1], dtype=torch.int32)}
    with raises_input_error(f"argument '{name}' holds a negative length"):
        torch.ops.greta.attention(q, k, v, False, None, lens.get("q_lens"), lens.get("kv_lens"))


def test_raw_attention_negative_lengths_refused() -> None:
    need_triton()
    if ON_GPU:
        pytest.skip("a GPU tensor's lengths are not read on the host (the kernel clamps them)")
    q, k, v = _qkv(torch.float16)
    with raises_input_error("negative length"):
        raw.attention(q, k, v, kv_lens=torch.tensor([-3], dtype=torch.int32))


def test_jax_attention_negative_lengths_refused() -> None:
    jnp = pytest.importorskip("jax.numpy")
    from greta_core import jax as gj

    q, k, v = (jnp.asarray(t.numpy()) for t in _qkv(torch.float32, device="cpu"))
    with raises_input_error("argument 'q_lens' holds a negative length"):
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
    with raises_input_error("overflows max_seq"):
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
    with raises_input_error("argument 'a' has dtype"):
        torch.ops.greta.matmul(a, a)
    q = torch.ones(1, 1, 2, 64, dtype=dtype)
    with raises_input_error("argument 'q' has dtype"):
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
    with raises_input_error("argument 'k_cache' has a zero stride"):
        torch.ops.greta.kv_cache_append(kc, vc, new, new, lens)
    assert not base.any()


def test_raw_kv_cache_refuses_a_broadcast_cache() -> None:
    need_triton()
    base = torch.zeros(1, 1, 8, 16, device=DEVICE)
    vc = base.expand(2, 2, 8, 16)
    kc = torch.zeros(2, 2, 8, 16, device=DEVICE)
    new = torch.ones(2, 2, 1, 16, device=DEVICE)
    lens = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    with raises_input_error("argument 'v_cache' has a zero stride"):
        raw.kv_cache_append(kc, vc, new, new, lens)
    assert not base.any()


def test_input_errors_are_greta_errors() -> None:
    from greta_core.errors import GretaError, GretaInputError

    assert issubclass(GretaInputError, GretaError) and issubclass(GretaInputError, ValueError)
    assert raw.GretaInputError is GretaInputError
