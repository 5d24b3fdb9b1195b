"""An op added through one declaration (greta_core.ops.declare) gets every binding.

The toy op lives in a module written to a temporary directory (its kernel and its
declaration, nothing else): torch.ops.greta, JAX, the raw launch, GretaCompute and the AOT
specs all come from the declaration, with no edit to any GRETA file.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from _kernel_testing import DEVICE, ON_GPU, expected_impl, need_triton  # noqa: E402

from greta_core import observe  # noqa: E402
from greta_core.ops import declare  # noqa: E402

# GRETA's kernels in training too (the tables hand small norm/softmax training calls to torch).
pytestmark = pytest.mark.usefixtures("greta_training")

TOY = """
import math

import triton
import triton.language as tl

from greta_core.ops._plan import Buffer, In, Launch, Out, Plan
from greta_core.ops._rows import arch_for, float_dtypes
from greta_core.ops._validate import check_same_device, check_same_shape, check_tensor
from greta_core.ops.declare import Backward, Front, Meta, OpDecl, declare


@triton.jit
def toy_scaled_add_kernel(x_ptr, y_ptr, n, alpha, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + offs, mask=mask).to(tl.float32)
    tl.store(out_ptr + offs, (x + alpha * y).to(out_ptr.dtype.element_ty), mask=mask)


def validate(x, y, alpha, reference=False):
    check_tensor("toy_scaled_add", "x", x, dtypes=float_dtypes(reference), contiguous=True)
    check_tensor("toy_scaled_add", "y", y, dtypes=(x.dtype,), contiguous=True)
    check_same_shape("toy_scaled_add", x=x, y=y)
    check_same_device("toy_scaled_add", x=x, y=y)
    return arch_for("toy_scaled_add", x, reference)


def plan(arch, x, y, alpha):
    n = math.prod(x.shape)
    block = 64
    launch = Launch(toy_scaled_add_kernel, (triton.cdiv(n, block),),
                    (In(0), In(1), n, alpha, Out(0)), {"BLOCK": block}, {"num_warps": 2})
    return Plan("toy_scaled_add", arch, (Buffer(x.shape, x.dtype),), (launch,) if n else (), (0,))


def grads(call, grad_outputs, saved):
    (dy,) = grad_outputs
    # d/dy = alpha * dy, written as dy + (alpha - 1) * dy: the op itself, in each binding.
    dy = call.contiguous(dy)
    return dy, call(TOY, dy, dy, saved.alpha - 1.0), None


@triton.jit
def toy_scale_kernel(x_ptr, n, alpha, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    tl.store(out_ptr + offs, (alpha * x).to(out_ptr.dtype.element_ty), mask=mask)


def validate_scale(x, alpha, reference=False):
    check_tensor("toy_scale_", "x", x, dtypes=float_dtypes(reference), contiguous=True)
    return arch_for("toy_scale_", x, reference)


def plan_scale(arch, x, alpha):
    n = math.prod(x.shape)
    launch = Launch(toy_scale_kernel, (triton.cdiv(n, 64),), (In(0), n, alpha, Out(0)),
                    {"BLOCK": 64}, {"num_warps": 2})
    # The buffer is x itself: written in place.
    return Plan("toy_scale_", arch, (Buffer(x.shape, x.dtype, alias=0),), (launch,) if n else (), (0,))


def scale_reference(x, alpha):
    if hasattr(x, "mul_"):  # torch: in place, no output
        x.mul_(alpha)
        return None
    return (alpha * x,)  # JAX: the updated array


TOY_SCALE = declare(OpDecl(
    name="toy_scale_",
    schema="Tensor(a!) x, float alpha -> ()",
    validate=validate_scale,
    plan=plan_scale,
    reference=scale_reference,
    front=False,
))


TOY = declare(OpDecl(
    name="toy_scaled_add",
    schema="Tensor x, Tensor y, float alpha=1.0 -> Tensor",
    describe="x + alpha * y",
    validate=validate,
    plan=plan,
    reference=lambda x, y, alpha=1.0: x + alpha * y,
    backward=Backward(grads),
    aot_cases=lambda arch: [
        (Meta.contiguous((256,), d), Meta.contiguous((256,), d), 0.5)
        for d in ("float32", "bfloat16")
    ],
))


# An op with a body: the binding's own GEMM, then the toy kernel on its result (no one plan).
def validate_mm(a, b, c, alpha, reference=False):
    check_tensor("toy_mm_add", "a", a, dtypes=float_dtypes(reference), ndim=2, contiguous=True)
    check_tensor("toy_mm_add", "b", b, dtypes=(a.dtype,), ndim=2, contiguous=True)
    check_tensor("toy_mm_add", "c", c, dtypes=(a.dtype,), ndim=2, contiguous=True)
    return arch_for("toy_mm_add", a, reference)


def mm_body(arch, a, b, c, alpha, *, wrap, stats):
    from greta_core.ops._plan import run

    ab = a @ b
    return tuple(run(plan(arch, Meta.of(ab), Meta.of(c), alpha), (ab, c), wrap=wrap))


def mm_jax_body(run, a, b, c, alpha, *, stats):
    ab = a @ b
    done = run(lambda arch: plan(arch, Meta.contiguous(ab.shape, ab.dtype),
                                 Meta.contiguous(c.shape, c.dtype), alpha), (ab, c))
    return done if done is not None else (ab + alpha * c,)


def mm_grads(call, grad_outputs, saved):
    (dy,) = grad_outputs
    dy = call.contiguous(dy)
    return dy @ saved.b.T, saved.a.T @ dy, call(TOY, dy, dy, saved.alpha - 1.0), None


TOY_MM = declare(OpDecl(
    name="toy_mm_add",
    schema="Tensor a, Tensor b, Tensor c, float alpha=1.0 -> Tensor",
    describe="a @ b + alpha * c",
    validate=validate_mm,
    plan=None,
    body=mm_body,
    jax_body=mm_jax_body,
    reference=lambda a, b, c, alpha=1.0: a @ b + alpha * c,
    backward=Backward(mm_grads, saves=("a", "b")),
))


# A kernel op whose last argument no caller gives: its public op (a Front) decides it per
# call from the binding's context. The toy shows it in its output: x + (alpha + 1) * y
# where a backward follows. alpha == 0 goes to torch's own code (a route).
def flagged_plan(arch, x, y, alpha, follows):
    return plan(arch, x, y, alpha + float(follows))


def flagged_grads(call, grad_outputs, saved):
    (dy,) = grad_outputs
    dy = call.contiguous(dy)
    return dy, call(TOY, dy, dy, saved.alpha + float(saved.follows) - 1.0), None, None


def flagged_route(context, x, y, alpha):
    return x * 1.0 if alpha == 0.0 else None


TOY_FLAGGED = declare(OpDecl(
    name="toy_flagged_kernel",
    schema="Tensor x, Tensor y, float alpha, bool follows=False -> Tensor",
    validate=lambda x, y, alpha, follows, reference=False: validate(x, y, alpha, reference),
    plan=flagged_plan,
    reference=lambda x, y, alpha, follows=False: x + (alpha + float(follows)) * y,
    backward=Backward(flagged_grads),
    front=False,
    public=Front(
        "toy_flagged", "Tensor x, Tensor y, float alpha=1.0 -> Tensor",
        lambda context, x, y, alpha: (context.backward_follows(x, y),), flagged_route,
    ),
))
"""


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The toy module, imported from a temporary directory, with every binding derived."""
    from greta_core.compute import REGISTRY
    from greta_core.compute import _declared as compute_declared
    from greta_core.jax import _declared as jax_declared
    from greta_core.torch import _declared as torch_declared

    folder = tmp_path_factory.mktemp("toy")
    (folder / "greta_toy_op.py").write_text(TOY)
    sys.path.insert(0, str(folder))
    try:
        module = importlib.import_module("greta_toy_op")
    finally:
        sys.path.remove(str(folder))
    op = module.TOY
    torch_declared.register(op)
    compute = compute_declared.caller(compute_declared.entry(op))
    yield op, jax_declared.bind(op), compute, folder
    REGISTRY.pop(op.name, None)
    declare.DECLARED.pop(op.name, None)
    declare.DECLARED.pop("toy_scale_", None)
    declare.DECLARED.pop("toy_mm_add", None)
    declare.DECLARED.pop("toy_flagged_kernel", None)
    sys.modules.pop("greta_toy_op", None)


def _xy(dtype: Any = torch.float32, grad: bool = False) -> tuple[Any, Any]:
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randn(3, 70, generator=g, dtype=dtype).to(DEVICE) for _ in range(2))
    return x.requires_grad_(grad), y.requires_grad_(grad)


def test_the_schema_gives_the_arguments() -> None:
    args, n_out = declare.parse_schema(
        "Tensor x, Tensor? b, float eps=1e-06, bool f=False -> (Tensor, Tensor)"
    )
    assert [(a.name, a.type, a.default, a.has_default) for a in args] == [
        ("x", "Tensor", None, False), ("b", "Tensor?", None, False),
        ("eps", "float", 1e-6, True), ("f", "bool", False, True),
    ]  # fmt: skip
    assert n_out == 2
    args, n_out = declare.parse_schema("Tensor dy, Tensor(a!) gate, Tensor(b!) up -> ()")
    assert [(a.name, a.type, a.mutable) for a in args] == [
        ("dy", "Tensor", False), ("gate", "Tensor", True), ("up", "Tensor", True),
    ]  # fmt: skip
    assert n_out == 0


@pytest.mark.parametrize(
    "shape, strides", [((3, 4), (4, 1)), ((3, 4), (1, 3)), ((3, 1, 4), (4, 9, 1)),
                       ((2, 3, 4), (12, 1, 3)), ((0, 4), (1, 7)), ((1, 5), (99, 1))],
)  # fmt: skip
def test_meta_is_contiguous_as_torch_says(shape: tuple, strides: tuple) -> None:
    t = torch.empty_strided(shape, strides)
    assert declare.Meta.of(t).is_contiguous == t.is_contiguous()


def test_an_op_that_writes_into_its_arguments_has_no_front_and_no_autograd() -> None:
    stub = {"validate": lambda *a, **k: "cpu", "plan": None, "reference": None}
    with pytest.raises(declare.GretaConfigError, match="no eager front and no autograd"):
        declare.OpDecl(name="toy_bad_", schema="Tensor(a!) x -> ()", **stub)
    backward = declare.Backward(lambda *a: (None,))
    with pytest.raises(declare.GretaConfigError, match="no eager front and no autograd"):
        declare.OpDecl(name="toy_bad_", schema="Tensor(a!) x -> ()", front=False,
                       backward=backward, **stub)  # fmt: skip


def test_saves_for_keeps_only_what_the_call_names() -> None:
    stub = {"validate": lambda *a, **k: "cpu", "plan": None, "reference": None}
    backward = declare.Backward(
        lambda *a: (None,), saves=("x", "y"), saves_outputs=(1,),
        saves_for=lambda x, y, flag: ("out1",) if flag else ("x", "y"),
        materialize_grads=False,
    )  # fmt: skip
    schema = "Tensor x, Tensor y, bool flag -> (Tensor, Tensor)"
    with pytest.raises(declare.GretaConfigError, match="for a kernel op"):
        declare.OpDecl(name="toy_saves", schema=schema, backward=backward, **stub)
    op = declare.OpDecl(name="toy_saves", schema=schema, backward=backward, front=False, **stub)
    x, y, o0, o1 = (torch.zeros(1) for _ in range(4))
    kept = op.saved((x, y, True), (o0, o1))
    assert (kept.x, kept.y, kept.out1, kept.flag) == (None, None, o1, True)
    kept = op.saved((x, y, False), (o0, o1))
    assert (kept.x, kept.y, kept.out1) == (x, y, None)


def test_raw_launch_runs_the_kernel(toy: Any) -> None:
    need_triton()
    op, *_ = toy
    x, y = _xy()
    out = op.raw(x, y, alpha=0.5)
    assert observe.last_implementation("toy_scaled_add") == expected_impl()
    torch.testing.assert_close(out, x + 0.5 * y)
    with pytest.raises(declare.GretaInputError, match="argument 'y' has dtype"):
        op.raw(x, y.half())


def test_torch_op_forward_backward_and_opcheck(toy: Any) -> None:
    x, y = _xy(grad=True)
    out = torch.ops.greta.toy_scaled_add(x, y, 2.0)
    torch.testing.assert_close(out, x.detach() + 2.0 * y.detach())
    dy = torch.randn_like(out)
    gx, gy = torch.autograd.grad(out, (x, y), dy)
    # fp32 sums of two terms: one rounding each.
    torch.testing.assert_close(gx, dy)
    torch.testing.assert_close(gy, 2.0 * dy)
    x64, y64 = (t.detach().cpu().double().requires_grad_() for t in (x, y))
    assert torch.autograd.gradcheck(
        lambda a, b: torch.ops.greta.toy_scaled_add(a, b, 0.3), (x64, y64)
    )
    torch.library.opcheck(torch.ops.greta.toy_scaled_add_fwd.default, (x, y, 0.5))
    torch.library.opcheck(torch.ops.greta.toy_scaled_add.default, (x, y, 0.5))


def test_cpu_tensors_run_the_reference_without_the_interpreter(
    toy: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GRETA_TRITON_ON_CPU", "0")
    x, y = (t.cpu() for t in _xy(torch.float64))
    out = torch.ops.greta.toy_scaled_add(x, y, 0.25)
    assert observe.last_implementation("toy_scaled_add") == "reference-torch"
    torch.testing.assert_close(out, x + 0.25 * y, rtol=0, atol=0)


def test_torch_compile_keeps_the_registered_op(toy: Any) -> None:
    from _kernel_testing import graph_recorder

    graphs, backend = graph_recorder()
    x, y = _xy(grad=True)
    torch._dynamo.reset()
    out = torch.compile(lambda a, b: torch.ops.greta.toy_scaled_add(a, b, 3.0), backend=backend)(
        x, y
    )
    assert any("greta.toy_scaled_add" in t for t in graphs[0]), sorted(graphs[0])
    torch.testing.assert_close(out, x.detach() + 3.0 * y.detach())
    # The Python entry (what greta_core.transformers calls) hands dynamo the same op.
    from greta_core.torch._declared import ops as entries

    out = torch.compile(lambda a, b: entries.toy_scaled_add(a, b, 3.0), backend=backend)(x, y)
    torch._dynamo.reset()
    assert any("greta.toy_scaled_add" in t for t in graphs[-2]), graphs  # dynamo's
    torch.testing.assert_close(out, x.detach() + 3.0 * y.detach())


def test_jax_binding_forward_and_grad(toy: Any) -> None:
    jax = pytest.importorskip("jax")
    import numpy as np
    from _kernel_testing import expected_jax_impl

    _, jax_fn, *_ = toy
    jnp = jax.numpy
    x, y = (jnp.asarray(np.arange(6, dtype=np.float32) * s) for s in (1.0, -0.5))
    np.testing.assert_allclose(np.asarray(jax_fn(x, y, 2.0)), np.asarray(x + 2.0 * y), rtol=1e-6)
    assert observe.last_implementation("toy_scaled_add") == expected_jax_impl()
    gx, gy = jax.grad(lambda a, b: jnp.sum(jax_fn(a, b, alpha=4.0)), argnums=(0, 1))(x, y)
    np.testing.assert_allclose(np.asarray(gx), np.ones(6), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(gy), np.full(6, 4.0), rtol=1e-6)


def test_an_op_with_a_body_gets_every_binding(toy: Any) -> None:
    # OpDecl.body / jax_body: the binding's own GEMM, then the declared kernel's plan.
    from greta_core.jax import _declared as jax_declared
    from greta_core.torch import _declared as torch_declared

    op = sys.modules["greta_toy_op"].TOY_MM
    torch_declared.register(op)
    g = torch.Generator().manual_seed(1)
    # Small integers: every product and sum is exact in fp32, whatever the GEMM's order.
    a, b, c = (torch.randint(-3, 4, s, generator=g).float().to(DEVICE) for s in
               ((4, 5), (5, 6), (4, 6)))  # fmt: skip
    want = a @ b + 2.0 * c
    if need_triton_here():
        torch.testing.assert_close(op.raw(a, b, c, 2.0), want, rtol=0, atol=0)
        assert observe.last_implementation("toy_scaled_add") == expected_impl()
    ag, bg, cg = (t.clone().requires_grad_() for t in (a, b, c))
    out = torch.ops.greta.toy_mm_add(ag, bg, cg, 2.0)
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    dy = torch.randint(-2, 3, out.shape, generator=g).float().to(DEVICE)
    ga, gb, gc = torch.autograd.grad(out, (ag, bg, cg), dy)
    torch.testing.assert_close(ga, dy @ b.T, rtol=0, atol=0)
    torch.testing.assert_close(gb, a.T @ dy, rtol=0, atol=0)
    torch.testing.assert_close(gc, 2.0 * dy, rtol=0, atol=0)
    torch.library.opcheck(torch.ops.greta.toy_mm_add_fwd.default, (a, b, c, 0.5))
    jax = pytest.importorskip("jax")
    import numpy as np

    jnp, jax_fn = jax.numpy, jax_declared.bind(op)
    ja, jb, jc = (jnp.asarray(t.cpu().numpy()) for t in (a, b, c))
    np.testing.assert_array_equal(np.asarray(jax_fn(ja, jb, jc, 2.0)), want.cpu().numpy())
    jga, _, jgc = jax.grad(lambda *x: jnp.sum(jax_fn(*x, alpha=2.0)), argnums=(0, 1, 2))(ja, jb, jc)
    np.testing.assert_array_equal(np.asarray(jga), np.ones((4, 6), np.float32) @ jb.T)
    np.testing.assert_array_equal(np.asarray(jgc), np.full((4, 6), 2.0, np.float32))


def test_a_public_front_decides_its_kernel_ops_flags_per_call(toy: Any) -> None:
    # OpDecl.public: torch.ops.greta.<name> and its Python entry take the public schema and
    # fill the kernel op's flag from the call (a backward follows, or not); JAX's context
    # tells nothing; a route hands a call to other code, which torch differentiates.
    from greta_core.jax import _declared as jax_declared
    from greta_core.torch import _declared as torch_declared

    torch_declared.register(sys.modules["greta_toy_op"].TOY_FLAGGED)
    x, y = _xy()
    entry = torch_declared.ops.toy_flagged
    for call in (torch.ops.greta.toy_flagged, entry):
        torch.testing.assert_close(call(x, y), x + y)  # no backward follows
        torch.testing.assert_close(call(x, y, alpha=0.5), x + 0.5 * y)
        xg, yg = (t.clone().requires_grad_() for t in (x, y))
        out = call(xg, yg, 0.5)
        torch.testing.assert_close(out.detach(), x + 1.5 * y)  # flagged: one more y
        gx, gy = torch.autograd.grad(out, (xg, yg), torch.ones_like(out))
        torch.testing.assert_close(gx, torch.ones_like(x))
        torch.testing.assert_close(gy, torch.full_like(y, 1.5))
        routed = call(xg, yg, 0.0)  # torch's own code: x alone, differentiated by torch
        torch.testing.assert_close(routed.detach(), x)
        assert torch.autograd.grad(routed.sum(), xg)[0].eq(1).all()
    jax = pytest.importorskip("jax")
    import numpy as np

    fn = jax_declared.bind_public(sys.modules["greta_toy_op"].TOY_FLAGGED)
    jx, jy = (jax.numpy.asarray(t.cpu().numpy()) for t in (x, y))
    np.testing.assert_allclose(np.asarray(fn(jx, jy, 0.5)), (x + 0.5 * y).cpu().numpy())
    gy = jax.grad(lambda a, b: jax.numpy.sum(fn(a, b, alpha=0.5)), argnums=1)(jx, jy)
    np.testing.assert_allclose(np.asarray(gy), np.full(y.shape, 0.5, np.float32))
    with pytest.raises(declare.GretaInputError, match="missing argument 'y'"):
        fn(jx)


def test_compute_entry_runs_greta_then_reference(toy: Any) -> None:
    from greta_core import compute

    _, _, call, _ = toy
    x, y = _xy()
    assert compute.REGISTRY["toy_scaled_add"].names() == ["greta", "reference"]
    torch.testing.assert_close(call(x, y), x + y)
    with compute.force("toy_scaled_add", "reference"):
        torch.testing.assert_close(call(x, y, 0.5), x + 0.5 * y)
    assert observe.last_implementation("compute.toy_scaled_add") == "reference"


def test_aot_specs_are_derived_from_the_plans(toy: Any) -> None:
    op, *_ = toy
    specs = declare.aot_specs(op, "gfx942")
    assert [s.signature for s in specs] == [
        {"x_ptr": f"*{d}", "y_ptr": f"*{d}", "n": "i32", "alpha": "fp32", "out_ptr": f"*{d}"}
        for d in ("fp32", "bf16")
    ]
    assert all(s.constexprs == {"BLOCK": 64} and s.options == {"num_warps": 2} for s in specs)
    # Every parameter of the kernel is typed or a constexpr, in the kernel's order.
    assert [*specs[0].signature, *specs[0].constexprs] == specs[0].kernel.arg_names


def test_eager_training_path_runs_the_launches_under_a_plain_function(
    toy: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On a GPU, plain tensors wanting grad take it; here the predicate is forced so the
    # interpreter runs that path (as test_launch_plans forces eager_raw).
    need_triton()
    from greta_core.ops import _calls

    x, y = _xy(grad=True)
    if not ON_GPU:  # the real predicate keeps CPU tensors on the triton_op's autograd
        out = torch.ops.greta.toy_scaled_add(x, y)
        assert "GeneratedBackwardFor_greta_toy_scaled_add_fwd" in out.grad_fn.name()
    monkeypatch.setattr(_calls, "eager_training", lambda t: True)
    out = torch.ops.greta.toy_scaled_add(x, y, 0.5)
    assert out.grad_fn.name() == "greta_toy_scaled_add_fwd_eagerBackward"
    assert observe.last_implementation("toy_scaled_add") == expected_impl()
    dy = torch.randn_like(out)
    gx, gy = torch.autograd.grad(out, (x, y), dy)
    torch.testing.assert_close(out, x.detach() + 0.5 * y.detach())
    torch.testing.assert_close(gx, dy)
    torch.testing.assert_close(gy, 0.5 * dy)


def test_the_python_entry_decides_as_the_front_without_the_dispatcher(
    toy: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ops.<name>`` (greta_core.torch._declared) takes the front's eager decision itself
    for a call typed as the schema; a call the dispatcher would convert (an int for a
    float, keywords) goes through torch.ops, whose front then decides. Outputs and
    gradients are the front's, bit for bit, the eager Function's backward included with
    create_graph (once_differentiable: a second differentiation fails)."""
    need_triton()
    from greta_core.ops import _calls
    from greta_core.torch._declared import ops as entries

    seen: list[tuple[str, Any]] = []

    def decide(tensors: tuple[Any, ...]) -> bool:
        seen.append((sys._getframe(2).f_code.co_name, tensors))  # eager <- front | entry
        return True

    monkeypatch.setattr(_calls, "eager_training", decide)
    x, y = _xy(grad=True)
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    results = []
    for call in (
        lambda: torch.ops.greta.toy_scaled_add(x, y, 0.5),
        lambda: entries.toy_scaled_add(x, y, 0.5),
        lambda: entries.toy_scaled_add(x, y, alpha=0.5),
    ):
        out = call()
        assert out.grad_fn.name() == "greta_toy_scaled_add_fwd_eagerBackward"
        results.append((out, *torch.autograd.grad(out, (x, y), dy)))
    assert [caller for caller, _ in seen] == ["front", "entry", "front"]
    for got in results[1:]:
        for have, want in zip(got, results[0], strict=True):
            assert torch.equal(have, want)
    seen.clear()
    entries.toy_scaled_add(x, y, 1)  # an int alpha: the dispatcher makes it a float
    assert [caller for caller, _ in seen] == ["front"]

    dy_wants_grad = dy.clone().requires_grad_()
    out = entries.toy_scaled_add(x, y, 0.5)
    gx, gy = torch.autograd.grad(out, (x, y), dy_wants_grad, create_graph=True)
    assert torch.equal(gx, results[0][1]) and torch.equal(gy, results[0][2])
    assert gy.requires_grad  # through once_differentiable's DelayedError node
    with pytest.raises(RuntimeError, match="differentiate twice"):
        gy.sum().backward()


DRIVER = """
import json, sys
sys.path.insert(0, sys.argv[2])
import greta_toy_op
from greta_core.kernel_wheels.aot import compile_spec, compiling_for
from greta_core.ops.declare import aot_specs

out = []
for spec in aot_specs(greta_toy_op.TOY, "gfx942"):
    with compiling_for("gfx942", sys.argv[1]):
        res = compile_spec(spec, "greta_toy_op", "gfx942", "aligned")
    out.append({"ok": res.ok, "error": res.error, "signature": res.signature})
print(json.dumps(out))
"""


@pytest.mark.slow
def test_derived_aot_specs_compile_without_a_gpu(toy: Any, tmp_path: Path) -> None:
    *_, folder = toy
    (tmp_path / "drive.py").write_text(textwrap.dedent(DRIVER))
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    proc = subprocess.run(
        [sys.executable, "drive.py", str(tmp_path / "cache"), str(folder)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [r["ok"] for r in results] == [True, True], results


@pytest.mark.parametrize("arch", ["gfx942", "sm_90"])
def test_kernel_wheels_find_the_declared_rope_specs(arch: str) -> None:
    # kernels/rope.py writes no aot_specs: discovery derives them from ops/rope.py's plans.
    from greta_core.kernel_wheels.aot import discover

    [found] = discover(arch, ["rope"])
    assert found.error == ""
    names = [s.name for s in found.specs]
    # 3 head shapes x 2 directions x (rope: 5 x/table dtype pairs; positions: 3 x 2 dtypes)
    assert len(names) == len(set(names)) == 66
    for spec in found.specs:
        named = [*spec.signature, *spec.constexprs]
        assert sorted(named) == sorted(spec.kernel.arg_names), spec.name
        # The unit strides are the constexpr 1 the JIT makes of them (aot_unit_ints).
        assert spec.constexprs["stride_xd"] == 1, spec.name
    kernels = {s.kernel.__name__ for s in found.specs}
    assert kernels == {"rope_kernel", "rope_positions_kernel"}


@pytest.fixture(scope="module")
def toy_scale(toy: Any) -> Any:
    """The toy module's op that writes into its argument: (declaration, JAX function)."""
    from greta_core.jax import _declared as jax_declared
    from greta_core.torch import _declared as torch_declared

    op = sys.modules["greta_toy_op"].TOY_SCALE
    torch_declared.register(op)
    return op, jax_declared.bind(op)


def test_a_mutating_op_writes_in_place_in_every_binding(
    toy_scale: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    op, jax_fn = toy_scale
    schema = str(torch.ops.greta.toy_scale_.default._schema)
    assert schema == "greta::toy_scale_(Tensor(a0!) x, float alpha) -> ()"
    assert not hasattr(torch.ops.greta, "toy_scale__fwd")  # no front: the triton_op itself
    x0 = torch.arange(70, dtype=torch.float32).to(DEVICE)
    x = x0.clone()
    # Exact: products by a power of two.
    assert torch.ops.greta.toy_scale_(x, 2.0) is None
    torch.testing.assert_close(x, 2.0 * x0, rtol=0, atol=0)
    if need_triton_here():
        assert op.raw(x, 0.5) is None
        torch.testing.assert_close(x, x0, rtol=0, atol=0)
        assert observe.last_implementation("toy_scale_") == expected_impl()
    monkeypatch.setenv("GRETA_TRITON_ON_CPU", "0")
    xc = x0.cpu().clone()
    torch.ops.greta.toy_scale_(xc, 4.0)
    assert observe.last_implementation("toy_scale_") == "reference-torch"
    torch.testing.assert_close(xc, 4.0 * x0.cpu(), rtol=0, atol=0)
    torch.library.opcheck(torch.ops.greta.toy_scale_.default, (x0.clone(), 0.25))
    jax = pytest.importorskip("jax")
    a = jax.numpy.arange(6, dtype=jax.numpy.float32)
    (updated,) = jax_fn(a, 2.0)  # JAX arrays are immutable: the updated one comes back
    assert updated.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    assert a.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def need_triton_here() -> bool:
    """The raw launch runs here: a GPU, or the interpreter on the CPU."""
    from greta_core.arch import interpreter_active

    return ON_GPU or interpreter_active()


@pytest.mark.parametrize("arch", ["gfx942", "sm_90"])
@pytest.mark.parametrize(
    "module, kernels, count",
    [("vec_add", {"vec_add_kernel"}, 3), ("swiglu", {"glu_fwd_kernel", "glu_bwd_kernel"}, 12),
     ("kv_cache", {"kv_cache_append_kernel"}, 9), ("matmul", {"matmul_kernel"}, 24),
     ("softmax", {"softmax_fwd_kernel", "softmax_bwd_kernel"}, 75)],
)  # fmt: skip
def test_kernel_wheels_find_every_declared_ops_specs(
    arch: str, module: str, kernels: set, count: int
) -> None:
    # The counts the hand-written aot_specs had (its in-place backward adds none: its
    # launches are the out-of-place one's).
    from greta_core.kernel_wheels.aot import discover

    [found] = discover(arch, [module])
    assert found.error == ""
    names = [s.name for s in found.specs]
    assert len(names) == len(set(names)) == count
    for spec in found.specs:
        # Every parameter typed or a constexpr, once (matmul's unit strides are constexprs).
        assert sorted([*spec.signature, *spec.constexprs]) == sorted(spec.kernel.arg_names)
    assert {s.kernel.__name__ for s in found.specs} == kernels


def test_a_backward_skips_the_gradients_nobody_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    # matmul's declared backward reads saved.needs_grad: a frozen weight costs no GEMM.
    from greta_core.ops import matmul
    from greta_core.torch import _declared as torch_declared

    calls = []
    real = torch_declared._torch_call
    counting = declare.Caller(lambda op, *a: calls.append(op.name) or real(op, *a), real.contiguous)
    monkeypatch.setattr(torch_declared, "_torch_call", counting)
    g = torch.Generator().manual_seed(1)
    a = torch.randn(5, 8, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(8, 3, generator=g, dtype=torch.float64)  # frozen
    bias = torch.randn(3, generator=g, dtype=torch.float64, requires_grad=True)
    out = torch.ops.greta.matmul(a, b, bias)
    dy = torch.randn_like(out)
    ga, gbias = torch.autograd.grad(out, (a, bias), dy)
    assert calls == ["matmul"]  # grad_a only
    torch.testing.assert_close(ga, dy @ b.t())
    torch.testing.assert_close(gbias, dy.sum(0))
    assert matmul.MATMUL.backward.saves == ("a", "b", "bias")


@pytest.mark.parametrize("op", ["vec_add", "softmax", "swiglu", "geglu", "matmul"])
def test_declared_ops_train_through_the_eager_function(
    op: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Plain GPU tensors with grad take a plain autograd.Function over the ready launches
    # (forward and backward); here the predicate is forced so the interpreter runs it.
    need_triton()
    import greta_core.torch  # noqa: F401  (registers torch.ops.greta)
    from greta_core import reference
    from greta_core.ops import _calls

    g = torch.Generator().manual_seed(3)
    dtype = torch.float16 if op == "matmul" else torch.float32

    def rand(*shape: int) -> Any:
        return torch.randn(*shape, generator=g, dtype=dtype).to(DEVICE).requires_grad_()

    args = {
        "vec_add": lambda: (rand(4, 24), rand(4, 24)),
        "softmax": lambda: (rand(4, 24),),
        "swiglu": lambda: (rand(4, 24), rand(4, 24)),
        "geglu": lambda: (rand(4, 24), rand(4, 24)),
        "matmul": lambda: (rand(4, 16), rand(24, 16).detach().t().requires_grad_(), rand(24)),
    }[op]()
    want_fn = {
        "vec_add": reference.vec_add, "softmax": reference.softmax, "matmul": reference.matmul,
        "swiglu": lambda a, b: reference.glu(a, b, "silu"),
        "geglu": lambda a, b: reference.glu(a, b, "gelu_tanh"),
    }[op]  # fmt: skip
    monkeypatch.setattr(_calls, "eager_training", lambda t: True)
    out = getattr(torch.ops.greta, op)(*args)
    assert out.grad_fn.name() == f"greta_{op}_fwd_eagerBackward"
    dy = torch.randn(out.shape, generator=g, dtype=dtype).to(DEVICE)
    got = torch.autograd.grad(out, args, dy)
    # The float64 reference's gradients; tolerances of the dtype (fp32 maths inside).
    ref_args = [a.detach().double().requires_grad_() for a in args]
    want = torch.autograd.grad(want_fn(*ref_args), ref_args, dy.double())
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.float16 else {}
    torch.testing.assert_close(out, want_fn(*ref_args).detach().to(dtype), **tol)
    for have, expected in zip(got, want, strict=True):
        torch.testing.assert_close(have, expected.to(dtype), **tol)


def test_a_scalar_before_an_optional_tensor_keeps_the_schema_order_in_public() -> None:
    """The public functions take the schema's order (attention's ``causal`` before
    ``q_lens``); the declaration's own order puts the tensors first."""
    stub = {"validate": lambda *a, **k: "cpu", "plan": lambda *a: None, "reference": None}
    op = declare.OpDecl(
        name="toy_order", schema="Tensor x, bool flag=False, float? s=None, Tensor? y=None -> Tensor",
        **stub,
    )  # fmt: skip
    assert [a.name for a in op.public_args] == ["x", "flag", "s", "y"]
    assert [a.name for a in op.args] == ["x", "y", "flag", "s"]
    x, y = torch.zeros(1), torch.ones(1)
    assert op.bind((x, 1, 2, y), {}) == (x, y, True, 2.0)
    assert op.bind((x,), {"y": y, "s": 0.5}) == (x, y, False, 0.5)
    assert op.bind((x, y, True), {}, public=False) == (x, y, True, None)
    assert op.from_public((x, True, 0.5, None)) == (x, None, True, 0.5)


def test_attention_takes_its_public_order_by_position_and_keyword() -> None:
    import greta_core.torch  # noqa: F401
    from greta_core import reference

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 5, 8, generator=g, dtype=torch.float64) for _ in range(3))
    lens = torch.tensor([5, 3], dtype=torch.int32)
    want = reference.attention(q, k, v, True, 0.5, None, lens)
    by_position = torch.ops.greta.attention(q, k, v, True, 0.5, None, lens)
    by_keyword = torch.ops.greta.attention(q, k, v, scale=0.5, kv_lens=lens, causal=True)
    with_lse = torch.ops.greta.attention_with_lse(q, k, v, True, 0.5, kv_lens=lens)[0]
    for got in (by_position, by_keyword, with_lse):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
