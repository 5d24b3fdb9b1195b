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
