"""The row norms as declarations (ops/rms_norm.py, add_rms_norm.py, layer_norm.py): the
public schemas they had when written by hand, the eager training path against the
registered op's autograd, rows that do not flatten, the derived AOT specs, JAX grads."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from _kernel_testing import DEVICE, ON_GPU, assert_close, need_triton  # noqa: E402

import greta_core.torch  # noqa: E402, F401  (registers torch.ops.greta)
from greta_core.ops import rms_norm  # noqa: E402

# The schemas of the hand-written registrations these declarations replace (main at
# 6539582): callers and saved graphs name these ops, so they stay as they were.
# GRETA's kernels in training too (the tables hand small norm/softmax training calls to torch).
pytestmark = pytest.mark.usefixtures("greta_training")

SCHEMAS = {
    "rms_norm": "greta::rms_norm(Tensor x, Tensor weight, float eps=9.9999999999999995e-07) -> Tensor",
    "rms_norm_fwd": "greta::rms_norm_fwd(Tensor x, Tensor weight, float eps) -> (Tensor, Tensor)",
    "rms_norm_bwd": "greta::rms_norm_bwd(Tensor dy, Tensor x, Tensor weight, Tensor rstd)"
    " -> (Tensor, Tensor)",
    "add_rms_norm": "greta::add_rms_norm(Tensor x, Tensor residual, Tensor weight,"
    " float eps=9.9999999999999995e-07) -> (Tensor, Tensor)",
    "add_rms_norm_fwd": "greta::add_rms_norm_fwd(Tensor x, Tensor residual, Tensor weight,"
    " float eps) -> (Tensor, Tensor, Tensor)",
    "add_rms_norm_bwd": "greta::add_rms_norm_bwd(Tensor dy, Tensor ds, Tensor s,"
    " Tensor weight, Tensor rstd) -> (Tensor, Tensor)",
    "layer_norm": "greta::layer_norm(Tensor x, Tensor weight, Tensor? bias=None,"
    " float eps=1.0000000000000001e-05) -> Tensor",
    "layer_norm_fwd": "greta::layer_norm_fwd(Tensor x, Tensor weight, Tensor? bias,"
    " float eps) -> (Tensor, Tensor, Tensor)",
    "layer_norm_bwd": "greta::layer_norm_bwd(Tensor dy, Tensor x, Tensor weight, Tensor mean,"
    " Tensor rstd) -> (Tensor, Tensor, Tensor)",
}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_derived_schemas_are_the_hand_written_ones(name: str) -> None:
    assert str(getattr(torch.ops.greta, name).default._schema) == SCHEMAS[name]


def test_a_kernel_op_gets_no_front() -> None:
    # front=False: greta::rms_norm_bwd is the triton_op itself, no greta::rms_norm_bwd_fwd.
    assert not hasattr(torch.ops.greta, "rms_norm_bwd_fwd")
    assert rms_norm.RMS_NORM_BWD.front is False and rms_norm.RMS_NORM.stats == ("rstd",)


def _inputs(op: str, dtype: Any = torch.float32) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """(differentiable inputs, the rest of the call) for a norm, rows of 24."""
    g = torch.Generator().manual_seed(3)

    def t(*shape: int) -> Any:
        return torch.randn(*shape, generator=g, dtype=dtype).to(DEVICE).requires_grad_()

    x, r, w, b = t(2, 3, 24), t(2, 3, 24), t(24), t(24)
    return {
        "rms_norm": ((x, w), (1e-6,)),
        "add_rms_norm": ((x, r, w), (1e-6,)),
        "layer_norm": ((x, w, b), (1e-5,)),
        "layer_norm_no_bias": ((x, w), (None, 1e-5)),
    }[op]


def _call(op: str, diff: tuple[Any, ...], rest: tuple[Any, ...]) -> Any:
    if op == "layer_norm_no_bias":
        return torch.ops.greta.layer_norm(*diff, *rest)
    return getattr(torch.ops.greta, op)(*diff, *rest)


@pytest.mark.parametrize("op", ["rms_norm", "add_rms_norm", "layer_norm", "layer_norm_no_bias"])
def test_eager_training_path_matches_the_registered_autograd(
    op: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The plain autograd.Function over the ready launches and the triton_op's registered
    # autograd run the same plans: bitwise-equal outputs and gradients. add_rms_norm's loss
    # reads y only, so s's gradient arrives as None (torch.library) or zeros (Function).
    need_triton()
    from greta_core.ops import _calls

    diff, rest = _inputs(op)
    name = "layer_norm" if op == "layer_norm_no_bias" else op

    def run() -> tuple[Any, tuple[Any, ...], str]:
        out = _call(op, diff, rest)
        y = out[0] if isinstance(out, tuple) else out
        dy = torch.linspace(-1, 1, y.numel(), device=DEVICE).reshape(y.shape)
        return y, torch.autograd.grad(y, diff, dy), y.grad_fn.name()

    if ON_GPU:  # the real predicate sends plain GPU tensors to the Function
        monkeypatch.setattr(_calls, "eager_training", lambda t: False)
    registered = run()
    assert registered[2].startswith(f"GeneratedBackwardFor_greta_{name}_fwd")
    monkeypatch.setattr(_calls, "eager_training", lambda t: True)
    eager = run()
    assert eager[2] == f"greta_{name}_fwd_eagerBackward"
    assert torch.equal(eager[0], registered[0])
    for got, want in zip(eager[1], registered[1], strict=True):
        assert torch.equal(got, want)
    # And against float64 autograd of the plain reference maths.
    from greta_core import reference

    maths = {
        "rms_norm": lambda x, w, eps: reference.rms_norm(x, w, eps),
        "add_rms_norm": lambda x, r, w, eps: reference.add_rms_norm_fwd(x, r, w, eps)[0],
        "layer_norm": lambda x, w, b, eps: reference.layer_norm(x, w, b, eps),
        "layer_norm_no_bias": lambda x, w, b, eps: reference.layer_norm(x, w, b, eps),
    }[op]
    ref_diff = tuple(t.detach().cpu().double().requires_grad_() for t in diff)
    ref_y = maths(*ref_diff, *rest)
    dy = torch.linspace(-1, 1, ref_y.numel(), dtype=torch.float64).reshape(ref_y.shape)
    ref_grads = torch.autograd.grad(ref_y, ref_diff, dy)
    assert_close(eager[0].cpu(), ref_y, torch.float32)
    for got, want in zip(eager[1], ref_grads, strict=True):
        assert_close(got.cpu(), want, torch.float32, scale=4.0)  # weight grads sum over rows


def test_rows_that_do_not_flatten_are_planned_as_a_dense_copy() -> None:
    need_triton()
    base = torch.randn(4, 3, 16, device=DEVICE)
    x = base.transpose(0, 1)  # [3, 4, 16], strides (16, 48, 1): no [rows, 16] view
    w = torch.randn(16, device=DEVICE)
    plan, copied = rms_norm.RMS_NORM.call(x, w, 1e-6)
    assert copied == (0,)
    assert plan.launches[0].args[3] == 16  # the copy's row stride
    _, no_copy = rms_norm.RMS_NORM.call(x.contiguous(), w, 1e-6)
    assert no_copy == ()
    assert torch.equal(rms_norm.rms_norm(x, w), rms_norm.rms_norm(x.contiguous(), w))


@pytest.mark.parametrize("arch", ["gfx942", "sm_90"])
def test_kernel_wheels_find_the_declared_norm_specs(arch: str) -> None:
    # The kernels write no aot_specs: discovery derives them from the declarations' cases.
    # The derived sets equalled the hand-written lists they replaced, spec by spec (175, 175,
    # 295; issue 25 report); the wheel now holds only the blocks the table maps the model
    # row widths to, "aligned" ints (configs.blocks.MODEL_ROW_WIDTHS, issue 24).
    from greta_core.kernel_wheels.aot import discover

    found = {f.module: f for f in discover(arch, ["rms_norm", "add_rms_norm", "layer_norm"])}
    counts = {module: len(f.specs) for module, f in found.items()}
    assert counts == {"rms_norm": 135, "add_rms_norm": 135, "layer_norm": 225}
    for f in found.values():
        assert f.error == ""
        names = [s.name for s in f.specs]
        assert len(names) == len(set(names))
        for spec in f.specs:
            assert [*spec.signature, *spec.constexprs] == spec.kernel.arg_names, spec.name
    stats_off = [
        s for s in found["layer_norm"].specs
        if s.kernel.__name__ == "layer_norm_fwd_kernel" and not s.constexprs["STORE_STATS"]
    ]  # fmt: skip
    # Without the statistics the kernel gets y's pointer for them: x's dtype, not fp32.
    assert {s.signature["mean_ptr"] == s.signature["x_ptr"] for s in stats_off} == {True}


@pytest.mark.parametrize("op", ["add_rms_norm", "layer_norm"])
def test_jax_grads_follow_the_declared_backward(op: str) -> None:
    jax = pytest.importorskip("jax")
    import numpy as np

    from greta_core import jax as gj
    from greta_core import reference

    jnp = jax.numpy
    rng = np.random.default_rng(0)
    x, r, dy = (rng.standard_normal((3, 16)).astype(np.float32) for _ in range(3))
    w, b = (rng.standard_normal(16).astype(np.float32) for _ in range(2))
    if op == "add_rms_norm":
        fn = lambda a, c, d: jnp.sum(gj.add_rms_norm(a, c, d)[0] * dy)  # noqa: E731
        ref = lambda a, c, d: (reference.add_rms_norm_fwd(a, c, d, 1e-6)[0] * t(dy)).sum()  # noqa: E731
        args = (x, r, w)
    else:
        fn = lambda a, c, d: jnp.sum(gj.layer_norm(a, c, d) * dy)  # noqa: E731
        ref = lambda a, c, d: (reference.layer_norm(a, c, d, 1e-5) * t(dy)).sum()  # noqa: E731
        args = (x, w, b)

    def t(a: Any) -> Any:
        return torch.from_numpy(np.asarray(a))

    grads = jax.grad(fn, argnums=(0, 1, 2))(*(jnp.asarray(a) for a in args))
    ref_args = tuple(t(a).double().requires_grad_() for a in args)
    ref(*ref_args).backward()
    for got, want in zip(grads, ref_args, strict=True):
        assert_close(t(got), want.grad, torch.float32, scale=4.0)


def test_the_forward_ops_statistics_are_not_differentiable() -> None:
    # Every statistic output is marked so, not the last one alone (mark_non_differentiable
    # replaces the set it marked before: one call with all of them).
    x = torch.randn(3, 8, requires_grad=True)
    w, b = torch.randn(8, requires_grad=True), torch.randn(8, requires_grad=True)
    y, mean, rstd = torch.ops.greta.layer_norm_fwd(x, w, b, 1e-5)
    assert (y.requires_grad, mean.requires_grad, rstd.requires_grad) == (True, False, False)
