"""The row ops' kernel-wheel blocks are exactly the ones their table maps the covered widths to.

A block the wheel lacks is a JIT compile on the user's first call. Softmax rows are sequence
or vocabulary lengths, so its wheel covers every width up to twice the op's one-pass limit
(MAX_BLOCK_N). A norm's row is a model width (hidden size, head_dim, low-rank projection), so
its wheel covers the blocks of `MODEL_ROW_WIDTHS` only, aligned ints only: other widths compile
on first use. Longer softmax rows are covered only where the table's rule for them equals its
rule at 2 * MAX_BLOCK_N.
"""

from __future__ import annotations

import json

import pytest

from greta_core import configs
from greta_core.arch import TUNED_ARCHS
from greta_core.configs.blocks import (
    MODEL_ROW_WIDTHS,
    MODEL_WIDTH_OPS,
    aot_variants,
    aot_widths,
    row_block,
)
from greta_core.kernel_wheels.aot import precompiled_int_variants
from greta_core.ops._rows import row_plan

NORM_OPS = ("rms_norm", "rms_norm_bwd", "add_rms_norm", "add_rms_norm_bwd", "layer_norm",
            "layer_norm_bwd")  # fmt: skip
ROW_OPS = (*NORM_OPS, "softmax", "softmax_bwd")
SOFTMAX_WIDTHS = (1, 7, 16, 17, 64, 96, 128, 200, 768, 1000, 4096, 5120, 11008, 16384, 20000)


def _key(op: str, arch: str, n_cols: int) -> tuple:
    plan = row_plan(op, arch, n_cols)
    return plan.block_n, plan.one_pass, tuple(sorted(plan.options.items()))


def _compiled(op: str, arch: str) -> list[tuple]:
    return [(b, p, tuple(sorted(o.items()))) for b, p, o in aot_variants(op, arch)]


@pytest.mark.parametrize("arch", sorted(TUNED_ARCHS))
@pytest.mark.parametrize("op", ROW_OPS)
def test_the_wheel_holds_exactly_the_blocks_of_its_widths(op: str, arch: str) -> None:
    compiled = _compiled(op, arch)
    assert len(compiled) == len(set(compiled))  # each block once
    assert set(compiled) == {_key(op, arch, n) for n in aot_widths(op, arch)}


@pytest.mark.parametrize("arch", sorted(TUNED_ARCHS))
@pytest.mark.parametrize("op", ("softmax", "softmax_bwd"))
def test_every_planned_softmax_block_is_an_aot_variant(op: str, arch: str) -> None:
    compiled = set(_compiled(op, arch))
    limit = 2 * configs.lookup(op, arch, {})["MAX_BLOCK_N"]
    for n_cols in [n for n in SOFTMAX_WIDTHS if n <= limit] + [limit]:
        assert _key(op, arch, n_cols) in compiled, f"{op} on {arch}: {n_cols} columns"
    assert precompiled_int_variants("softmax") == ("aligned", "ragged")


@pytest.mark.parametrize("arch", sorted(TUNED_ARCHS))
@pytest.mark.parametrize("op", NORM_OPS)
def test_norms_cover_model_widths_and_compile_the_rest_on_first_use(op: str, arch: str) -> None:
    compiled = set(_compiled(op, arch))
    for n_cols in MODEL_ROW_WIDTHS:
        assert _key(op, arch, n_cols) in compiled, f"{op} on {arch}: {n_cols} columns"
    # Rows of 16 columns are no model's width: their block is not in the wheel (JIT).
    assert _key(op, arch, 16) not in compiled


def test_model_widths_are_aligned_so_norms_need_no_ragged_entries() -> None:
    # "aligned" = every int argument divisible by 16: a contiguous row of a model width.
    assert all(n % 16 == 0 for n in MODEL_ROW_WIDTHS)
    assert {op.removesuffix("_bwd") for op in NORM_OPS} == MODEL_WIDTH_OPS
    for module in MODEL_WIDTH_OPS:
        assert precompiled_int_variants(module) == ("aligned",)


def test_a_tuned_table_changes_the_norm_specs_with_it() -> None:
    """The rms_norm specs follow the table the wheel ships: a smaller one-pass limit moves
    the widest model rows to the loop block, and no other block appears."""
    from greta_core.configs import shipped_table
    from greta_core.kernel_wheels.aot import discover

    table = json.loads(shipped_table("gfx942"))
    for op in ("rms_norm", "rms_norm_bwd"):
        table["ops"][op]["default"].update({"MAX_BLOCK_N": 2048, "LOOP_BLOCK_N": 1024})
    configs.build_with_table("gfx942", json.dumps(table))
    try:
        # row_block on a fresh lookup: row_plan's memo may hold the shipped table's plans.
        expected = {
            row_block(configs.lookup("rms_norm", "gfx942", {"N": n}), n) for n in MODEL_ROW_WIDTHS
        }
        (found,) = discover("gfx942", ["rms_norm"])
        specs = [s for s in found.specs if s.kernel.__name__ == "rms_norm_fwd_kernel"]
    finally:
        configs.build_with_table("gfx942", None)
    blocks = {(s.constexprs["BLOCK_N"], s.constexprs["ONE_PASS"]) for s in specs}
    assert blocks == expected
    assert (1024, False) in blocks and max(b for b, _ in blocks) == 2048
