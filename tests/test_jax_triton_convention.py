"""greta_core.jax._plan's adapter per jax-triton release (0.3.x for Triton 3.6, 0.4.x for
Triton 3.7+): the operands handed to ``triton_call`` bind every kernel parameter exactly once,
in parameter order, and each output is written through the buffer the release hands it. The
GPU tests of the JAX bindings (test_kernel_kv_cache.py, test_kernel_fused.py) run them."""

from __future__ import annotations

from typing import Any

import pytest

from greta_core.jax._plan import _runtime_params, call_form, jax_triton_convention
from greta_core.ops._plan import In, Out, Plan
from greta_core.ops.kv_cache import plan as kv_plan
from greta_core.ops.linear_cross_entropy import plan_rows


@pytest.mark.parametrize(
    ("version", "convention"),
    [("0.3.1", "appended"), ("0.3.0", "appended"), ("0.4.1", "operand"), ("0.5.0", "operand")],
)
def test_convention_by_release(version: str, convention: str) -> None:
    assert jax_triton_convention(version) == convention


def _kv() -> Plan:
    batch, heads, max_seq, d, n_new = 2, 3, 16, 64, 2
    ks = (heads * n_new * d, n_new * d, d)
    cs = (heads * max_seq * d, max_seq * d, d)
    return kv_plan((batch, heads, max_seq, d), n_new, (ks, ks, cs, cs), "float32", "sm_90")


def _lce() -> Plan:
    return plan_rows(8, 64, 64, "float32", -100, True, False, "sm_90")


def _form(p: Plan, convention: str) -> tuple[list[str], Any, list[Any], list[Any]]:
    (launch,) = p.launches
    written = launch.written()
    lead = list(launch.args[: len(launch.args) - len(written)])
    specs = [p.buffers[j] for j in written]
    assert not any(type(a) is Out for a in lead)
    aliases = {
        pos: k
        for k, b in enumerate(specs)
        if b.alias is not None
        for pos, a in enumerate(lead)
        if type(a) is In and a.index == b.alias
    }
    names = _runtime_params(launch.kernel)
    new = lambda b: ("input", b.alias) if b.alias is not None else ("fresh", b.shape)  # noqa: E731
    return names, call_form(names, lead, specs, aliases, convention, new), lead, specs


@pytest.mark.parametrize("make", [_kv, _lce], ids=["kv_cache", "linear_cross_entropy"])
def test_appended_keeps_the_03_call(make: Any) -> None:
    names, (positional, keywords, io, zeroed), lead, specs = _form(make(), "appended")
    assert positional == lead and keywords == {} and zeroed is True
    # 0.3.x: every output is a parameter after the inputs; the aliased ones map input -> output.
    assert len(positional) + len(specs) == len(names)
    assert all(specs[k].alias == lead[pos].index for pos, k in io.items())


@pytest.mark.parametrize("make", [_kv, _lce], ids=["kv_cache", "linear_cross_entropy"])
def test_operand_gives_every_output_parameter_its_own_aliased_operand(make: Any) -> None:
    names, (positional, keywords, io, zeroed), lead, specs = _form(make(), "operand")
    assert zeroed is False  # fresh outputs come as operands built like the plan's buffers
    # Every non-constexpr parameter bound once, in parameter order: no placeholder is left,
    # so jax-triton 0.4 hands the kernel its operands' buffers in order.
    assert names[: len(positional)] + list(keywords) == names
    assert list(keywords) == names[len(lead) :]
    # Each output is the operand of its own parameter: the aliased input, or a fresh buffer.
    assert io == {len(lead) + k: k for k in range(len(specs))}
    for k, b in enumerate(specs):
        value = keywords[names[len(lead) + k]]
        assert value == (("input", b.alias) if b.alias is not None else ("fresh", b.shape))
    assert any(b.alias is not None for b in specs)  # the cases this adapter exists for


class _Eqn:
    invars = ("a", "b", "c")


def _two_arg_rule(used_outs: list[bool], eqn: Any) -> tuple[list[bool], Any]:
    return [True] * len(eqn.invars), eqn


def _three_arg_default(used_outs: list[bool], live_ins: list[bool], eqn: Any) -> Any:
    raise AssertionError("the default rule is only inspected")


def test_dce_rule_of_jax_triton_041_is_adapted_to_jax_012() -> None:
    """jax-triton 0.4.1's two-argument DCE rule under jax 0.12's three-argument calls."""
    from greta_core.jax._runtime import adapt_dce_rule

    prim = object()
    rules: dict[Any, Any] = {prim: _two_arg_rule}
    assert adapt_dce_rule(rules, prim, _three_arg_default)
    eqn = _Eqn()
    used, kept = rules[prim]([False], [True, True, True], eqn)
    assert (used, kept) == ([True, True, True], eqn)  # a kernel call is never dead code


def test_dce_rule_left_alone_where_jax_and_jax_triton_agree() -> None:
    from greta_core.jax._runtime import adapt_dce_rule

    prim = object()
    rules: dict[Any, Any] = {prim: _two_arg_rule}
    # jax through 0.11 calls rule(used_outs, eqn), as jax-triton's rule expects.
    assert not adapt_dce_rule(rules, prim, _two_arg_rule)
    assert rules[prim] is _two_arg_rule
    assert not adapt_dce_rule({}, prim, _three_arg_default)  # nothing registered


@pytest.mark.parametrize("version", ["0.3.1", "0.4.1"])
def test_a_norm_backward_in_one_launch_gets_its_counter_zeroed(
    monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    """The norms' one-launch backward (``norm_bwd_plan`` with the bound on) under JAX: one
    triton_call whose outputs are the gradient, the int32 counter, dx and the partials, in
    the kernel's parameter order; the counter starts as zeros (0.3: ``zeroed_outputs``;
    0.4: a zeros operand aliased to it); the results are dx and dweight."""
    import sys
    import types

    jnp = pytest.importorskip("jax.numpy")
    from greta_core import configs
    from greta_core.jax import _plan as jax_plan
    from greta_core.ops.declare import Meta
    from greta_core.ops.rms_norm import plan_bwd

    x, w, stat = (Meta.contiguous(s, d) for s, d in
                  (((7, 40), "float32"), ((40,), "float32"), ((7,), "float32")))  # fmt: skip
    with configs.Override({"norm_bwd_reduce": {"MAX_PARTIALS": 10**6}}):
        plan = plan_bwd("sm_90", x, x, w, stat)
    calls: list[dict[str, Any]] = []

    def triton_call(*args: Any, **kw: Any) -> list[Any]:
        calls.append({"args": args, **kw})
        return [jnp.full(s.shape, k, s.dtype) for k, s in enumerate(kw["out_shape"])]

    fake = types.SimpleNamespace(__version__=version, triton_call=triton_call)
    monkeypatch.setitem(sys.modules, "jax_triton", fake)
    inputs = tuple(jnp.ones(m.shape, m.dtype) for m in (x, x, w, stat))
    dx, dw = jax_plan.run(plan, inputs)
    (call,) = calls
    shapes = [(tuple(s.shape), str(s.dtype)) for s in call["out_shape"]]
    assert shapes == [((40,), "float32"), ((1,), "int32"), ((7, 40), "float32"),
                      ((3, 40), "float32")]  # fmt: skip
    assert int(dw[0]) == 0 and int(dx[0, 0]) == 2  # dweight, dx: the first and third outputs
    assert call["REDUCE_LAST"] is True and call["grid"] == (3,)
    if version == "0.3.1":
        assert call["zeroed_outputs"] == (1,) and "counter_ptr" not in call
    else:
        assert "zeroed_outputs" not in call and not call["counter_ptr"].any()
        assert call["counter_ptr"].dtype == jnp.int32
