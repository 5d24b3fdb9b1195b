"""greta_core.jax._plan's adapter per jax-triton release (0.3.x for Triton 3.6, 0.4.x for
Triton 3.7+): the operands handed to ``triton_call`` bind every kernel parameter exactly once,
and aliased outputs are written through the operand the release expects. The GPU tests of
the JAX bindings (test_kernel_kv_cache.py, test_kernel_fused.py) run them for real."""

from __future__ import annotations

import pytest

from greta_core.jax._plan import call_form, jax_triton_convention
from greta_core.ops._plan import In, Out
from greta_core.ops.kv_cache import plan as kv_plan


@pytest.mark.parametrize(
    ("version", "convention"),
    [("0.3.1", "appended"), ("0.3.0", "appended"), ("0.4.1", "operand"), ("0.5.0", "operand")],
)
def test_convention_by_release(version: str, convention: str) -> None:
    assert jax_triton_convention(version) == convention


def _kv_case() -> tuple[list[str], list, list, list, dict[int, int]]:
    batch, heads, max_seq, d, n_new = 2, 3, 16, 64, 2
    ks = (heads * n_new * d, n_new * d, d)
    cs = (heads * max_seq * d, max_seq * d, d)
    p = kv_plan((batch, heads, max_seq, d), n_new, (ks, ks, cs, cs), "float32", "sm_90")
    (launch,) = p.launches
    written = launch.written()
    lead = list(launch.args[: len(launch.args) - len(written)])
    specs = [p.buffers[j] for j in written]
    inputs = ["k_cache", "v_cache", "k", "v", "lens"]
    args = [inputs[a.index] if type(a) is In else a for a in lead]
    aliases = {
        pos: k
        for k, b in enumerate(specs)
        if b.alias is not None
        for pos, a in enumerate(lead)
        if type(a) is In and a.index == b.alias
    }
    names = [n for n in launch.kernel.arg_names if n not in launch.constexprs]
    assert not any(type(a) is Out for a in lead)
    return names, args, specs, inputs, aliases


def test_appended_keeps_the_03_call() -> None:
    names, args, specs, inputs, aliases = _kv_case()
    positional, keywords, io = call_form(names, args, specs, inputs, aliases, "appended")
    assert positional == args and keywords == {} and io == aliases
    # 0.3.x: every output is a parameter after the inputs.
    assert len(positional) + len(specs) == len(names)


def test_operand_binds_each_parameter_once_and_aliases_the_written_one() -> None:
    names, args, specs, inputs, aliases = _kv_case()
    positional, keywords, io = call_form(names, args, specs, inputs, aliases, "operand")
    # jax-triton 0.4: operands (positional, then keywords in parameter order) plus one
    # placeholder per unaliased output fill every non-constexpr parameter exactly once.
    bound = names[: len(positional)] + list(keywords)
    unaliased = [k for k, b in enumerate(specs) if b.alias is None]
    assert len(set(bound)) == len(bound) and len(bound) + len(unaliased) == len(names)
    assert list(keywords) == ["k_cache_ptr", "v_cache_ptr"]
    assert keywords == {"k_cache_ptr": "k_cache", "v_cache_ptr": "v_cache"}
    # The aliased operands are the written parameters (operand numbering follows the
    # parameters: the lead, then the keywords), each mapped to its output.
    order = names[: len(positional)] + list(keywords)
    assert {order[i]: k for i, k in io.items()} == {"k_cache_ptr": 0, "v_cache_ptr": 1}
    # The unaliased output (new lengths) fills the one parameter still missing.
    missing = [n for n in names if n not in bound]
    assert missing == ["new_lens_ptr"] and unaliased == [2]
