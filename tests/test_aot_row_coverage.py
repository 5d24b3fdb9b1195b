"""Every block a row op's launch plan can pick is compiled into the kernel wheel.

A block the wheel lacks is a JIT compile on the user's first call. The wheel once started
at 256 columns, so short rows (the smoke test's 64, per-head q/k norms over a head_dim of
64 or 128) always compiled; this walks the widths the plans see, for every tuned arch, up
to twice the op's one-pass limit (MAX_BLOCK_N). Longer rows are covered only where the
table's rule for them equals its rule at 2 * MAX_BLOCK_N: on gfx942 the backward ops have a
rule that ends there (`waves_per_eu`), so rows past it compile on first use; covering them
needs AOT spec names that carry the launch options (two specs would share a name today).
"""

from __future__ import annotations

import pytest

from greta_core import configs
from greta_core.arch import TUNED_ARCHS
from greta_core.configs.blocks import aot_variants
from greta_core.ops._rows import row_plan

ROW_OPS = ("rms_norm", "rms_norm_bwd", "add_rms_norm", "add_rms_norm_bwd", "layer_norm",
           "layer_norm_bwd", "softmax", "softmax_bwd")  # fmt: skip
WIDTHS = (1, 7, 16, 17, 64, 96, 128, 200, 768, 1000, 4096, 5120, 11008, 16384, 20000)


@pytest.mark.parametrize("arch", sorted(TUNED_ARCHS))
@pytest.mark.parametrize("op", ROW_OPS)
def test_every_planned_row_block_is_an_aot_variant(op: str, arch: str) -> None:
    compiled = {(block, one_pass, tuple(sorted(options.items())))
                for block, one_pass, options in aot_variants(op, arch)}  # fmt: skip
    limit = 2 * configs.lookup(op, arch, {})["MAX_BLOCK_N"]
    for n_cols in [n for n in WIDTHS if n <= limit] + [limit]:
        plan = row_plan(op, arch, n_cols)
        key = (plan.block_n, plan.one_pass, tuple(sorted(plan.options.items())))
        assert key in compiled, f"{op} on {arch}: {n_cols} columns plan {key}, not in the wheel"
