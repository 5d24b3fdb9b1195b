"""Launch plans: one per op, executed by the raw API, the torch ops and JAX.

The JAX executor is exercised on the CPU through a stand-in for ``jax_triton.triton_call``
that runs the kernel in Triton's interpreter on copies of the arrays: it checks what the
executor hands jax-triton (argument order, outputs, aliases, zeroed outputs, options).
"""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
np = pytest.importorskip("numpy")

from _kernel_testing import (  # noqa: E402
    DEVICE,
    ON_GPU,
    expected_impl,
    graph_recorder,
    need_triton,
)
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from greta_core import configs  # noqa: E402
from greta_core.arch import interpreter_active  # noqa: E402
from greta_core.ops import _plan, rms_norm  # noqa: E402
from greta_core.ops._plan import Buffer, In, Launch, Out, Plan  # noqa: E402
from greta_core.ops.declare import Meta  # noqa: E402

# GRETA's kernels in training too (the tables hand small norm/softmax training calls to torch).
pytestmark = pytest.mark.usefixtures("greta_training")


def _rms_plan(rows: int = 4, arch: str = "sm_90") -> Plan:
    """rms_norm's memoized plan (its declaration's) for x [rows, 64] fp32, with rstd."""
    x, w = Meta.contiguous((rows, 64), "float32"), Meta.contiguous((64,), "float32")
    return rms_norm.RMS_NORM.plan(arch, x, w, 1e-6, True)


def test_plan_is_memoized_per_call_signature() -> None:
    a = _rms_plan()
    assert _rms_plan() is a
    assert _rms_plan(8) is not a
    (launch,) = a.launches
    assert launch.grid == (4,) and launch.written() == (0, 1)
    assert launch.args[:2] == (In(0), In(1)) and launch.args[-2:] == (Out(0), Out(1))
    assert launch.options == configs.launch_options(
        configs.lookup("rms_norm", "sm_90", {"N": 64}), "sm_90"
    )


def test_plan_follows_a_swapped_config_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    # `greta tune` swaps configs.lookup: a memoized plan must not hide the candidate.
    shipped = _rms_plan()
    real = configs.lookup
    monkeypatch.setattr(
        configs, "lookup", lambda op, arch, f=None: {**real(op, arch, f), "num_warps": 1}
    )
    swapped = _rms_plan()
    assert swapped.launches[0].options["num_warps"] == 1
    monkeypatch.setattr(configs, "lookup", real)
    assert _rms_plan() is shipped


def test_empty_problem_launches_nothing_and_zeroes_gradients() -> None:
    rows, w = Meta.contiguous((0, 8), "float32"), Meta.contiguous((8,), "float32")
    plan = rms_norm.RMS_NORM_BWD.plan("cpu", rows, rows, w, Meta.contiguous((0,), "float32"))
    assert plan.launches == ()
    dx, dw = _plan.run(plan, [torch.empty(0, 8)] * 3 + [torch.empty(0)])
    assert dx.shape == (0, 8) and torch.equal(dw, torch.zeros(8))


def test_torch_executor_passes_refs_buffers_and_scalars_in_order() -> None:
    seen = []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **kw: seen.append((grid, args, kw))

    x = torch.ones(3)
    plan = Plan(
        "fake", "cpu",
        (Buffer((3,), "float32", zeroed=True), Buffer((3,), "float32", alias=0),
         Buffer((2,), "int32", fill=7)),
        (Launch(Kernel(), (5,), (In(0), 2.5, Out(2), Out(0), Out(1)), {"B": 1}, {"num_warps": 2}),),
        (0, 2),
    )  # fmt: skip
    zeros, filled = _plan.run(plan, (x,))
    ((grid, args, kw),) = seen
    assert grid == (5,) and kw == {"B": 1, "num_warps": 2}
    assert args[0] is x and args[1] == 2.5 and args[4] is x  # the aliased buffer is the input
    assert args[2] is filled and torch.equal(filled, torch.full((2,), 7, dtype=torch.int32))
    assert args[3] is zeros and torch.equal(zeros, torch.zeros(3))


# --- the JAX executor, through an interpreter-backed stand-in for jax-triton -----------------


def _fake_triton_call(
    *args, kernel, out_shape, grid, input_output_aliases=None, zeroed_outputs=(),
    num_warps=4, num_stages=2, **constexprs,
):  # fmt: skip
    import jax.numpy as jnp

    calls.append({"num_warps": num_warps, "aliases": dict(input_output_aliases or {})})
    targs = [
        torch.from_numpy(np.array(a)) if hasattr(a, "dtype") and hasattr(a, "shape") else a
        for a in args
    ]
    shapes = list(out_shape) if isinstance(out_shape, (list, tuple)) else [out_shape]
    outs = []
    for k, spec in enumerate(shapes):
        src = [i for i, o in (input_output_aliases or {}).items() if o == k]
        if src:
            outs.append(targs[src[0]])
            continue
        dtype = getattr(torch, str(spec.dtype))
        # jax-triton's outputs hold whatever the allocator had: poison them, so a kernel
        # that reads an output it did not get aliased to its input fails here too.
        fill = 0 if k in zeroed_outputs else (float("nan") if dtype.is_floating_point else -7)
        outs.append(torch.full(tuple(spec.shape), fill, dtype=dtype))
    kernel[grid](*targs, *outs, **constexprs)
    results = [jnp.asarray(t.numpy()) for t in outs]
    return results if isinstance(out_shape, (list, tuple)) else results[0]


calls: list[dict] = []


@pytest.fixture
def jax_on_triton(monkeypatch: pytest.MonkeyPatch):
    """greta_core.jax with its Triton path on, jax-triton replaced by the interpreter."""
    pytest.importorskip("jax")
    need_triton()
    if ON_GPU:
        pytest.skip("interpreter stand-in: CPU only")
    from greta_core.jax import _attention, _runtime

    fake = types.ModuleType("jax_triton")
    fake.triton_call = _fake_triton_call
    # The stand-in binds outputs as jax-triton 0.3 does ("appended"); 0.4's operand form
    # has its own test (tests/test_jax_triton_convention.py).
    fake.__version__ = "0.3.1"
    monkeypatch.setitem(sys.modules, "jax_triton", fake)
    for module in (_runtime, _attention):  # declared ops import both from _runtime
        monkeypatch.setattr(module, "use_triton", lambda: True, raising=False)
        monkeypatch.setattr(module, "jax_arch", lambda: "cpu", raising=False)
    calls.clear()
    from greta_core import jax as gj

    return gj


def _arr(shape, seed, dtype="float32"):
    import jax.numpy as jnp

    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape).astype(dtype))


def _close(got, want, tol=2e-5):
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert np.abs(got - want).max() <= tol * max(1.0, np.abs(want).max())


def test_jax_rms_norm_and_grads_run_the_plans(jax_on_triton) -> None:
    import jax
    import jax.numpy as jnp

    from greta_core import observe, reference

    x, w, dy = _arr((3, 40), 0), _arr((40,), 1), _arr((3, 40), 2)
    got = jax_on_triton.rms_norm(x, w)
    assert observe.last_implementation("rms_norm") == "jax-triton"
    want = reference.rms_norm(torch.from_numpy(np.array(x)), torch.from_numpy(np.array(w)))
    _close(got, want.numpy())
    gx, gw = jax.grad(lambda a, b: jnp.sum(jax_on_triton.rms_norm(a, b) * dy), (0, 1))(x, w)
    assert observe.last_implementation("rms_norm_bwd") == "jax-triton"
    xt = torch.from_numpy(np.array(x)).requires_grad_()
    wt = torch.from_numpy(np.array(w)).requires_grad_()
    (reference.rms_norm(xt, wt) * torch.from_numpy(np.array(dy))).sum().backward()
    _close(gx, xt.grad.numpy(), 1e-4)
    _close(gw, wt.grad.numpy(), 1e-4)


def test_jax_layer_norm_grads_run_the_plans(jax_on_triton) -> None:
    """layer_norm's backward plan (dweight's and dbias's partials in one buffer, one col_sum
    launch writing both) under jax-triton's binding: every output a buffer of its own."""
    import jax
    import jax.numpy as jnp

    from greta_core import observe, reference

    x, w, b, dy = _arr((5, 24), 8), _arr((24,), 9), _arr((24,), 10), _arr((5, 24), 11)
    loss = lambda a, c, d: jnp.sum(jax_on_triton.layer_norm(a, c, d) * dy)  # noqa: E731
    gx, gw, gb = jax.grad(loss, (0, 1, 2))(x, w, b)
    assert observe.last_implementation("layer_norm_bwd") == "jax-triton"
    xt, wt, bt = (torch.from_numpy(np.array(a)).requires_grad_() for a in (x, w, b))
    (reference.layer_norm(xt, wt, bt) * torch.from_numpy(np.array(dy))).sum().backward()
    for got, want in ((gx, xt.grad), (gw, wt.grad), (gb, bt.grad)):
        _close(got, want.numpy(), 1e-4)


def test_jax_layer_norm_softmax_vec_add_rope(jax_on_triton) -> None:
    from greta_core import reference

    t = lambda a: torch.from_numpy(np.array(a))  # noqa: E731
    x, w = _arr((2, 3, 24), 3), _arr((24,), 4)
    _close(jax_on_triton.layer_norm(x, w, None), reference.layer_norm(t(x), t(w)).numpy())
    _close(jax_on_triton.softmax(x), reference.softmax(t(x)).numpy())
    _close(jax_on_triton.vec_add(x, x), (t(x) * 2).numpy())
    xr, cos, sin = _arr((2, 5, 3, 8), 5), _arr((5, 4), 6), _arr((5, 4), 7)
    _close(jax_on_triton.rope(xr, cos, sin), reference.rope(t(xr), t(cos), t(sin)).numpy())


def test_jax_kv_cache_append_aliases_the_caches(jax_on_triton) -> None:
    import jax.numpy as jnp

    kc, vc = jnp.zeros((2, 1, 6, 8), jnp.float32), jnp.zeros((2, 1, 6, 8), jnp.float32)
    k, v = _arr((2, 1, 2, 8), 8), _arr((2, 1, 2, 8), 9)
    lens = jnp.asarray([0, 3], jnp.int32)
    kc2, vc2, new = jax_on_triton.kv_cache_append(kc, vc, k, v, lens)
    assert calls[-1]["aliases"] == {3: 0, 4: 1}
    assert np.array_equal(np.asarray(new), [2, 5])
    assert np.array_equal(np.asarray(kc2)[1, :, 3:5], np.asarray(k)[1])
    assert np.array_equal(np.asarray(vc2)[0, :, 0:2], np.asarray(v)[0])


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_jax_linear_cross_entropy_runs_the_plan(jax_on_triton, reduction: str) -> None:
    # The rows kernel overwrites the logits with dlogits: jax-triton must get them aliased.
    import jax
    import jax.numpy as jnp

    from greta_core import observe

    rng = np.random.default_rng(15)
    h = rng.standard_normal((10, 16)).astype(np.float32)
    wo = (rng.standard_normal((40, 16)) / 4).astype(np.float32)
    t = rng.integers(0, 40, 10)
    t[3] = -100
    weights = np.arange(1, 11, dtype=np.float64)

    def lce(a, b):
        loss = jax_on_triton.linear_cross_entropy(a, b, jnp.asarray(t), -100, reduction)
        return jnp.sum(loss * weights.astype(np.float32)) if reduction == "none" else loss

    val, (gh, gw) = jax.value_and_grad(lce, (0, 1))(jnp.asarray(h), jnp.asarray(wo))
    assert observe.last_implementation("linear_cross_entropy") == "jax-triton"
    assert calls and all(c["aliases"] == {2: 1} for c in calls)
    # float64 on the host: loss rows and their gradients from the definition.
    logits = h.astype(np.float64) @ wo.astype(np.float64).T
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    valid = t != -100
    rows = -np.log(p[np.arange(10), np.where(valid, t, 0)]) * valid
    scale = weights * valid if reduction == "none" else valid / valid.sum()
    dlogits = (p - np.eye(40)[np.where(valid, t, 0)]) * scale[:, None]
    want = (rows * weights).sum() if reduction == "none" else rows.sum() / valid.sum()
    _close(val, want, 1e-5)
    _close(gh, dlogits @ wo.astype(np.float64), 1e-5)
    _close(gw, dlogits.T @ h.astype(np.float64), 1e-5)


def test_jax_attention_and_matmul_fp16(jax_on_triton) -> None:
    from greta_core import reference

    t = lambda a: torch.from_numpy(np.array(a))  # noqa: E731
    q, k, v = (_arr((1, 2, 5, 64), s, "float16") for s in (10, 11, 12))
    kv_lens = np.asarray([3], np.int32)
    import jax.numpy as jnp

    got = jax_on_triton.attention(q, k, v, False, None, None, jnp.asarray(kv_lens))
    want = reference.attention(t(q), t(k), t(v), False, None, None, torch.from_numpy(kv_lens))
    _close(got, want.numpy(), 5e-3)
    a, b = _arr((5, 16), 13, "float16"), _arr((16, 7), 14, "float16")
    _close(jax_on_triton.matmul(a, b), reference.matmul(t(a), t(b)).numpy(), 5e-3)


# --- the eager hot path ---------------------------------------------------------------------


def test_call_cache_validates_once_per_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    need_triton()
    from greta_core import raw
    from greta_core.errors import GretaInputError

    rms_norm._y_call.clear()
    seen = []
    real = rms_norm.validate
    monkeypatch.setattr(rms_norm, "validate", lambda *a, **k: seen.append(1) or real(*a, **k))
    x, w = torch.randn(3, 2, 16, device=DEVICE), torch.randn(16, device=DEVICE)
    first = raw.rms_norm(x, w)
    assert torch.equal(raw.rms_norm(x, w), first) and seen == [1]
    raw.rms_norm(x[:, :1], w)  # another signature: validated (and planned) again
    assert seen == [1, 1]
    with pytest.raises(GretaInputError):  # bad input is never cached: raises every time
        raw.rms_norm(x, torch.randn(15, device=DEVICE))
    with pytest.raises(GretaInputError):
        raw.rms_norm(x, torch.randn(15, device=DEVICE))


def test_call_cache_copies_leading_dims_that_do_not_flatten() -> None:
    need_triton()
    from greta_core import raw, reference

    x = torch.randn(2, 3, 16, device=DEVICE).transpose(0, 1)  # rows not evenly strided
    w = torch.randn(16, device=DEVICE)
    torch.testing.assert_close(raw.rms_norm(x, w), reference.rms_norm(x, w, 1e-6))


def _front_and_reference(op: str) -> tuple[Any, Any]:
    """(the torch.ops.greta call, the torch reference) on small fp32 inputs."""
    from greta_core import reference

    x, r = torch.randn(4, 32, device=DEVICE), torch.randn(4, 32, device=DEVICE)
    w, b = torch.randn(32, device=DEVICE), torch.randn(32, device=DEVICE)
    xr = torch.randn(2, 4, 3, 16, device=DEVICE).transpose(1, 2)  # [B, S=3, H=4, D]
    cos, sin = torch.randn(3, 8, device=DEVICE), torch.randn(3, 8, device=DEVICE)
    pos = torch.arange(3, device=DEVICE) + 5
    q = torch.randn(1, 4, 1, 64, device=DEVICE, dtype=torch.float16)
    kv = torch.randn(1, 2, 5, 64, device=DEVICE, dtype=torch.float16)
    a, bt = (torch.randn(s, device=DEVICE, dtype=torch.float16) for s in ((3, 32), (16, 32)))
    bias = torch.randn(16, device=DEVICE, dtype=torch.float16)
    g = torch.ops.greta
    return {
        "rms_norm": (lambda: g.rms_norm(x, w, 1e-6), lambda: reference.rms_norm(x, w, 1e-6)),
        "layer_norm": (
            lambda: g.layer_norm(x, w, b, 1e-5),
            lambda: reference.layer_norm_fwd(x, w, b, 1e-5)[0],
        ),
        "add_rms_norm": (
            lambda: g.add_rms_norm(x, r, w, 1e-6),
            lambda: reference.add_rms_norm_fwd(x, r, w, 1e-6)[:2],
        ),
        "swiglu": (lambda: g.swiglu(x, r), lambda: reference.glu(x, r, "silu")),
        "geglu": (lambda: g.geglu(x, r), lambda: reference.glu(x, r, "gelu_tanh")),
        # rope on a strided view (HF's transposed q/k), cos/sin [S, D/2].
        "rope": (lambda: g.rope(xr, cos, sin), lambda: reference.rope(xr, cos, sin)),
        "rope_positions": (
            lambda: g.rope_positions(xr, pos, 500.0, True),
            lambda: reference.rope_positions(xr, pos, 500.0, True),
        ),
        # A decode-shaped GQA call: one query token, fp16 (the kernel's dtypes).
        "attention": (
            lambda: g.attention(q, kv, kv * 0.5, False, 0.2),
            lambda: reference.attention(q, kv, kv * 0.5, False, 0.2),
        ),
        "vec_add": (lambda: g.vec_add(x, r), lambda: reference.vec_add(x, r)),
        "softmax": (lambda: g.softmax(x), lambda: reference.softmax(x)),
        # F.linear's form: a weight's transpose (strided), with and without a bias.
        "matmul": (lambda: g.matmul(a, bt.t(), bias), lambda: reference.matmul(a, bt.t(), bias)),
        "matmul_no_bias": (lambda: g.matmul(a, bt.t()), lambda: reference.matmul(a, bt.t())),
    }[op]


# The triton_op each front calls when it does not launch itself (default: f"{op}_fwd").
_FRONT_TORCH_OP = {"matmul_no_bias": "matmul_fwd"}
# The op name the kernel's launch records (default: the front's).
_RECORDED = {"matmul_no_bias": "matmul"}
# One plan either way (no statistics the triton_op path would add): the same kernel.
_ONE_PLAN = ("rope", "rope_positions", "attention", "vec_add", "softmax", "matmul",
             "matmul_no_bias")  # fmt: skip


class _GretaOpsSeen(TorchDispatchMode):
    """Records the greta ops a CompositeImplicitAutograd front calls (the front itself
    decomposes above the Python dispatch key, so only its hops reach the mode)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "greta":
            self.seen.append(func._opname)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    "op",
    ["rms_norm", "layer_norm", "add_rms_norm", "swiglu", "geglu", "rope", "rope_positions",
     "attention", "vec_add", "softmax", "matmul", "matmul_no_bias"],
)  # fmt: skip
def test_composite_op_launches_the_plan_directly_when_eager(
    monkeypatch: pytest.MonkeyPatch, op: str
) -> None:
    # On a GPU, plain tensors without autograd skip the triton_op's dispatch; here the
    # predicate is forced so the interpreter runs that path (launch(eager=True) declines
    # CPU tensors, so ForwardCall.if_eager asks eager_raw and runs the ordinary path).
    need_triton()
    import greta_core.torch  # noqa: F401  (registers torch.ops.greta.*)
    from greta_core import observe
    from greta_core.ops import _calls

    front, want = _front_and_reference(op)
    fp16 = op == "attention" or op.startswith("matmul")
    tol = {"rtol": 5e-3, "atol": 5e-3} if fp16 else {}
    monkeypatch.setattr(_calls, "eager_raw", lambda *t: True)
    with _GretaOpsSeen() as mode:
        got = front()
    assert mode.seen == [] and observe.last_implementation(_RECORDED.get(op, op)) == expected_impl()
    torch.testing.assert_close(got, want(), **tol)
    monkeypatch.setattr(_calls, "eager_raw", lambda *t: False)
    with _GretaOpsSeen() as mode:
        by_torch_op = front()
    assert mode.seen == [_FRONT_TORCH_OP.get(op, f"{op}_fwd")]
    torch.testing.assert_close(by_torch_op, want(), **tol)
    if op in _ONE_PLAN:
        assert torch.equal(got, by_torch_op)


@pytest.mark.parametrize("op", ["rope", "rope_positions", "attention"])
def test_composite_op_takes_its_torch_op_for_cpu_tensors_and_autograd(op: str) -> None:
    # The real predicate: CPU tensors never launch from the front, and a tensor wanting
    # grad keeps the triton_op's autograd (eager_raw's GPU cases: tests/test_direct_launch.py).
    need_triton()
    import greta_core.torch  # noqa: F401

    front, _ = _front_and_reference(op)
    with _GretaOpsSeen() as mode:
        front()
    assert mode.seen == [_FRONT_TORCH_OP.get(op, f"{op}_fwd")]
    x = torch.randn(1, 2, 2, 8, device=DEVICE, requires_grad=True)
    c, s = torch.randn(2, 4, device=DEVICE), torch.randn(2, 4, device=DEVICE)
    y = torch.ops.greta.rope(x, c, s)
    assert "greta_rope_fwd" in y.grad_fn.name()  # the triton_op's autograd
    (gx,) = torch.autograd.grad(y, x, torch.ones_like(y))
    from greta_core import reference

    # The rotation is orthogonal: the gradient is the inverse rotation of dy.
    torch.testing.assert_close(gx, reference.rope(torch.ones_like(x), c, s, True))


@pytest.mark.parametrize("op", ["rope", "rope_positions", "attention"])
def test_raw_call_validates_once_per_signature_and_raises_every_time(
    monkeypatch: pytest.MonkeyPatch, op: str
) -> None:
    need_triton()
    from greta_core import raw
    from greta_core.errors import GretaInputError
    from greta_core.ops import attention, rope

    module = attention if op == "attention" else rope
    check = "validate_positions" if op == "rope_positions" else "validate"
    seen = []
    real = getattr(module, check)
    monkeypatch.setattr(module, check, lambda *a, **k: seen.append(1) or real(*a, **k))
    for cache in (attention._fwd_call, rope._rope_call, rope._positions_call):
        cache.clear()  # no signature cached by an earlier test
    if op == "attention":
        q = torch.randn(1, 2, 3, 64, device=DEVICE, dtype=torch.float16)
        kv = torch.randn(1, 1, 4, 64, device=DEVICE, dtype=torch.float16)
        call = lambda t: raw.attention(q, t, t)  # noqa: E731
        good, bad = kv, kv[..., :32]
    else:
        x = torch.randn(1, 3, 2, 8, device=DEVICE)
        if op == "rope":
            c = torch.randn(3, 4, device=DEVICE)
            call = lambda t: raw.rope(x, t, t)  # noqa: E731
            good, bad = c, torch.randn(4, 4, device=DEVICE)
        else:
            call = lambda t: raw.rope_positions(x, t, 100.0)  # noqa: E731
            good, bad = torch.arange(3, device=DEVICE), torch.arange(3.0, device=DEVICE)
    first = call(good)
    assert torch.equal(call(good), first) and seen == [1]
    for _ in range(2):  # bad input is never cached: it raises every time
        with pytest.raises(GretaInputError):
            call(bad)
    assert seen == [1, 1, 1]


@pytest.mark.parametrize("op", ["vec_add", "softmax", "matmul"])
def test_front_takes_its_triton_op_for_cpu_tensors_and_keeps_its_autograd(op: str) -> None:
    # The real predicate (no forcing): CPU tensors take the triton_op, and so does a tensor
    # wanting grad, whose gradients come from the triton_op's autograd.
    need_triton()
    import greta_core.torch  # noqa: F401
    from greta_core import reference

    front, want = _front_and_reference(op)
    with _GretaOpsSeen() as mode:
        got = front()
    assert mode.seen == [f"{op}_fwd"]
    torch.testing.assert_close(got, want(), rtol=5e-3, atol=5e-3)
    g = torch.Generator(device=DEVICE).manual_seed(0)
    if op == "matmul":  # fp16: the kernel's dtypes; a weight's transpose, with a bias
        dtype, tol = torch.float16, {"rtol": 1e-2, "atol": 1e-2}
        a, w = (torch.randn(s, device=DEVICE, generator=g).to(dtype) for s in ((3, 32), (16, 32)))
        bias = torch.randn(16, device=DEVICE, generator=g).to(dtype)
        inputs = [a.requires_grad_(), w.requires_grad_(), bias.requires_grad_()]
        y = torch.ops.greta.matmul(a, w.t(), bias)
        dy = torch.randn(3, 16, device=DEVICE, generator=g).to(dtype)
        want_grads = [
            reference.matmul(dy, w.detach()), reference.matmul(dy.t(), a.detach()),
            dy.float().sum(0).to(dtype),
        ]  # fmt: skip
    else:
        tol = {}
        x, r = (torch.randn(4, 32, device=DEVICE, generator=g) for _ in range(2))
        dy = torch.randn(4, 32, device=DEVICE, generator=g)
        if op == "vec_add":
            inputs = [x.requires_grad_(), r.requires_grad_()]
            y = torch.ops.greta.vec_add(x, r)
            want_grads = [dy, dy]
        else:
            inputs = [x.requires_grad_()]
            y = torch.ops.greta.softmax(x)
            want_grads = [reference.softmax_bwd(dy, reference.softmax(x.detach()))]
    assert f"greta_{op}_fwd" in y.grad_fn.name()  # the triton_op's autograd
    grads = torch.autograd.grad(y, inputs, dy)
    for got_grad, want_grad in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got_grad, want_grad, **tol)


@pytest.mark.parametrize("op", ["vec_add", "softmax", "matmul"])
def test_torch_compile_graphs_hold_the_fronts_triton_op(op: str) -> None:
    """Dynamo records the front (greta::X); AOTAutograd decomposes it into the triton_op
    greta::X_fwd: on a GPU the forward graph launches the Triton kernel, and so does the
    backward of softmax (softmax_bwd) and matmul (two GEMMs through greta::matmul); on the
    CPU the triton_ops trace their torch reference."""
    import greta_core.torch  # noqa: F401
    from greta_core import reference

    graphs, backend = graph_recorder()

    dtype = torch.float16 if op == "matmul" and ON_GPU else torch.float32
    x = torch.randn(4, 32, device=DEVICE).to(dtype).requires_grad_()
    w = torch.randn(16, 32, device=DEVICE).to(dtype)
    f = {
        "vec_add": lambda x: torch.ops.greta.vec_add(x, x * 3) * 2,
        "softmax": lambda x: torch.ops.greta.softmax(x) * 2,
        "matmul": lambda x: torch.ops.greta.matmul(x, w.t()) * 2,
    }[op]
    want = {
        "vec_add": lambda x: 8 * x,
        "softmax": lambda x: 2 * reference.softmax(x),
        "matmul": lambda x: 2 * reference.matmul(x, w.t()),
    }[op]
    dy = torch.randn(4, 16 if op == "matmul" else 32, device=DEVICE).to(dtype)
    torch._dynamo.reset()
    y = torch.compile(f, fullgraph=True, backend=backend)(x)
    (gx,) = torch.autograd.grad(y, x, dy)
    torch._dynamo.reset()
    dynamo, forward, backward = graphs
    assert f"greta.{op}" in dynamo, sorted(dynamo)  # the front, not greta.{op}_fwd
    if ON_GPU:
        for graph in (forward, backward) if op != "vec_add" else (forward,):
            assert any("triton_kernel_wrapper" in t for t in graph), sorted(graph)
    tol = {"rtol": 1e-2, "atol": 1e-2} if dtype == torch.float16 else {}
    xr = x.detach().requires_grad_()
    want_y = want(xr)
    (want_gx,) = torch.autograd.grad(want_y, xr, dy)
    torch.testing.assert_close(y, want_y, **tol)
    torch.testing.assert_close(gx, want_gx, **tol)


@pytest.mark.parametrize("op", ["vec_add", "softmax", "matmul", "matmul_bias"])
def test_forward_call_validates_once_per_signature_and_raises_every_time(
    monkeypatch: pytest.MonkeyPatch, op: str
) -> None:
    # matmul's optional bias is a slot of the key: with and without one are two signatures.
    need_triton()
    from greta_core import raw
    from greta_core.errors import GretaInputError
    from greta_core.ops import matmul, softmax, vec_add

    module = {"vec_add": vec_add, "softmax": softmax}.get(op, matmul)
    seen = []
    real = module.validate
    monkeypatch.setattr(module, "validate", lambda *a, **k: seen.append(1) or real(*a, **k))
    for cache in (vec_add._call, softmax._fwd_call, matmul._call):
        cache.clear()  # no signature cached by an earlier test
    if op == "vec_add":
        x = torch.randn(6, device=DEVICE)
        call = lambda t: raw.vec_add(x, t)  # noqa: E731
        good, bad = torch.randn(6, device=DEVICE), torch.randn(7, device=DEVICE)
    elif op == "softmax":
        call = raw.softmax
        good, bad = torch.randn(3, 8, device=DEVICE), torch.ones(4, 3, device=DEVICE).t()
    else:
        a = torch.randn(2, 16, device=DEVICE, dtype=torch.float16)
        b = torch.randn(16, 8, device=DEVICE, dtype=torch.float16)
        if op == "matmul":
            call = lambda t: raw.matmul(a, t)  # noqa: E731
            good, bad = b, b[:8]
        else:
            call = lambda t: raw.matmul(a, b, t)  # noqa: E731
            good = torch.randn(8, device=DEVICE, dtype=torch.float16)
            bad = torch.randn(9, device=DEVICE, dtype=torch.float16)
    first = call(good)
    assert torch.equal(call(good), first) and seen == [1]
    if op.startswith("matmul"):  # the other bias slot: another signature, validated again
        other = raw.matmul(a, b, None if op == "matmul_bias" else good[0, :8])
        assert other.shape == first.shape and seen == [1, 1]
        seen.pop()
    for _ in range(2):  # bad input is never cached: it raises every time
        with pytest.raises(GretaInputError):
            call(bad)
    assert seen == [1, 1, 1]


def test_attention_length_values_are_checked_on_every_call() -> None:
    # A negative length is a value, not part of the call signature: a cached signature
    # still gets the check (CPU tensors, where reading the values is free: Triton's
    # interpreter; on a GPU machine raw CPU tensors are refused before any length is read).
    if not interpreter_active():
        pytest.skip("CPU tensors through the raw API need Triton's interpreter")
    from greta_core import raw
    from greta_core.errors import GretaInputError

    q = torch.randn(2, 2, 3, 64, dtype=torch.float16)
    kv = torch.randn(2, 1, 4, 64, dtype=torch.float16)
    ok = torch.tensor([4, 2], dtype=torch.int32)
    raw.attention(q, kv, kv, kv_lens=ok)
    raw.attention(q, kv, kv, kv_lens=ok)
    with pytest.raises(GretaInputError, match="negative length"):
        raw.attention(q, kv, kv, kv_lens=torch.tensor([4, -1], dtype=torch.int32))


def _norm_forward(op: str) -> tuple[Any, tuple[Any, ...], Any, int]:
    """(ops module, call arguments, the reference forward, saved statistics): every output
    of the reference, statistics last."""
    from greta_core import reference
    from greta_core.ops import add_rms_norm, layer_norm

    g = torch.Generator(device=DEVICE).manual_seed(0)
    x, r = (torch.randn(3, 40, device=DEVICE, generator=g) for _ in range(2))
    w, b = (torch.randn(40, device=DEVICE, generator=g) for _ in range(2))
    return {
        "rms_norm": (rms_norm, (x, w, 1e-6), lambda: reference.rms_norm_fwd(x, w, 1e-6), 1),
        "layer_norm": (
            layer_norm, (x, w, b, 1e-5), lambda: reference.layer_norm_fwd(x, w, b, 1e-5), 2
        ),
        "layer_norm_no_bias": (
            layer_norm, (x, w, None, 1e-5), lambda: reference.layer_norm_fwd(x, w, None, 1e-5), 2
        ),
        "add_rms_norm": (
            add_rms_norm, (x, r, w, 1e-6), lambda: reference.add_rms_norm_fwd(x, r, w, 1e-6), 1
        ),
    }[op]  # fmt: skip


@pytest.mark.parametrize("one_pass", [True, False])
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm", "layer_norm_no_bias", "add_rms_norm"])
def test_y_only_plan_writes_the_same_outputs_without_the_statistics(
    monkeypatch: pytest.MonkeyPatch, op: str, one_pass: bool
) -> None:
    # A call no backward follows takes the y-only plan: its kernel's stores of the saved
    # statistics off and their pointers y's own, so a store left on would overwrite y.
    need_triton()
    if not one_pass:  # rows of 40 in blocks of 16: the chunked path
        real = configs.lookup
        monkeypatch.setattr(
            configs, "lookup",
            lambda o, a, f=None: {**real(o, a, f), "MAX_BLOCK_N": 16, "LOOP_BLOCK_N": 16},
        )  # fmt: skip
    module, args, reference_fwd, n_stats = _norm_forward(op)
    with_stats, y_only = module._fwd_call(*args)[0], module._y_call(*args)[0]
    (launch,) = y_only.launches
    assert launch.constexprs["ONE_PASS"] is one_pass
    assert y_only.buffers == with_stats.buffers[:-n_stats]  # the statistics' buffers gone
    full = module._fwd_call.run(_plan._identity, *args)
    outputs = module._y_call.run(_plan._identity, *args)
    assert len(outputs) == len(full) - n_stats
    for got, want in zip(outputs, full, strict=False):
        # Two compilations of the kernel: with the stores gone the compiler may contract
        # the fp32 arithmetic differently (seen for layer_norm on the H100), so a few ulp,
        # not bit equality; a statistics store left on would put whole values into y.
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for got, want in zip(full, reference_fwd(), strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("given", ["", "q", "kv", "q+kv"])
def test_attention_ready_launch_inputs_are_the_plans_inputs(given: str) -> None:
    # A ready launch passes the call's argument at positions[i] as the plan's In(i): the
    # declaration's tensors (q, k, v, q_lens, kv_lens), None for a length not given, which
    # no launch argument names.
    need_triton()
    from greta_core.ops import attention

    q = torch.randn(2, 2, 3, 64, device=DEVICE, dtype=torch.float16)
    kv = torch.randn(2, 1, 4, 64, device=DEVICE, dtype=torch.float16)
    names = given.split("+")
    q_lens = torch.tensor([3, 1], dtype=torch.int32, device=DEVICE) if "q" in names else None
    kv_lens = torch.tensor([4, 2], dtype=torch.int32, device=DEVICE) if "kv" in names else None
    args = (q, kv, kv, q_lens, kv_lens, True, None)
    call = attention._fwd_call
    resolved = call(*args)
    plan, positions = call._plan_inputs(resolved)  # the ready launch's
    ready_inputs = tuple(args[i] for i in positions)
    _, inputs = call._inputs(resolved, args)  # the ordinary path's
    assert inputs == ready_inputs == (q, kv, kv, q_lens, kv_lens)
    (launch,) = plan.launches
    lens_args = launch.args[3:5]  # the kernel's (q_lens, kv_lens) parameters
    if given:
        named = {"q": q_lens, "kv": kv_lens}
        for name, arg in zip(("q", "kv"), lens_args, strict=True):
            if type(arg) is In:
                assert ready_inputs[arg.index] is named[name]
            else:  # the plan's own full-length vector for the one not given
                assert name not in names and type(arg) is Out
