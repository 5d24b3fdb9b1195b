"""What a kernel wheel precompiles: the count the dry run plans is the count a build compiles,
and the int specialisations left out are ones GRETA's calls cannot produce (or, for the norms,
widths no model has: those compile on first use, counted by ``observe``)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from greta_core.commands.build_kernels import plan_counts
from greta_core.configs import shipped_table
from greta_core.configs.blocks import MODEL_WIDTH_OPS, aot_variants
from greta_core.kernel_wheels.aot import VARIANTS, precompiled_int_variants
from greta_core.ops._plan import In, Out

ROOT = Path(__file__).resolve().parent.parent


def test_int_specialisations_per_module() -> None:
    for module in (*MODEL_WIDTH_OPS, "rope"):
        assert precompiled_int_variants(module) == ("aligned",), module
    for module in ("softmax", "matmul", "vec_add", "kv_cache", "col_sum"):
        assert precompiled_int_variants(module) == VARIANTS, module


def _ints(args: tuple) -> list[int]:
    return [a for a in args if type(a) is int and not isinstance(a, (In, Out))]


@pytest.mark.parametrize("head_dim", [64, 80, 96, 128])
def test_no_rope_call_has_every_int_ragged(head_dim: int) -> None:
    """Odd sequence length and head count, x a ragged view: the output strides (multiples of
    head_dim) still give an int divisible by 16."""
    from greta_core.ops.declare import Meta
    from greta_core.ops.rope import plan_rope, plan_rope_positions

    seq, heads = 7, 3
    x = Meta((1, seq, heads, head_dim), (seq * heads * 99 + 1, heads * 99, 99, 1), "bfloat16")
    table = Meta((seq, head_dim // 2), (head_dim // 2 + 1, 1), "float32")
    positions = Meta((seq,), (1,), "int32")
    plans = [plan_rope("gfx942", x, table, table, False),
             plan_rope_positions("gfx942", x, positions, 1e4, True)]  # fmt: skip
    for plan in plans:
        [launch] = plan.launches
        ints = _ints(launch.args)
        assert any(v % 16 == 0 for v in ints), ints


def _per_module(line: str) -> dict[str, int]:
    inner = re.search(r" MB \((.*)\)$", line).group(1)
    return {m: int(c) for m, c in (part.rsplit(" ", 1) for part in inner.split(", "))}


def test_dry_run_counts_what_the_table_requests() -> None:
    """`greta build-kernels --dry-run`: per module, the norms' count is their dtype pairs x
    (forward flags x the blocks the table maps the model widths to + backward blocks), aligned
    only; with an estimate of time and size."""
    proc = subprocess.run(
        [sys.executable, "-m", "greta", "build-kernels", "--arch", "gfx942", "--dry-run",
         "--jobs", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    [line] = proc.stdout.splitlines()
    head = (
        r"gfx942: (\d+) kernels, estimated (\d+) s on 2 worker\(s\) \((\d+) CPU-s\), ~[\d.]+ MB \("
    )
    match = re.match(head, line)
    assert match, line
    # Two workers share the CPU seconds.
    assert abs(int(match.group(2)) - int(match.group(3)) / 2) <= 1
    counts = _per_module(line)
    assert int(line.split()[1]) == sum(counts.values())
    pairs = 5  # (x, weight) dtypes: fp32/fp32, fp16/fp16, fp16/fp32, bf16/bf16, bf16/fp32
    fwd_flags = {"layer_norm": 4, "rms_norm": 2, "add_rms_norm": 2}  # stats stores x bias
    for op, flags in fwd_flags.items():
        fwd, bwd = len(aot_variants(op, "gfx942")), len(aot_variants(f"{op}_bwd", "gfx942"))
        assert counts[op] == pairs * (flags * fwd + bwd), op
    # Softmax keeps every block and both int specialisations (any sequence length).
    blocks = len(aot_variants("softmax", "gfx942")) + len(aot_variants("softmax_bwd", "gfx942"))
    assert counts["softmax"] == 3 * 2 * blocks  # dtypes x (aligned, ragged)


def test_the_shared_wheel_compiled_what_the_plan_counted(gfx942_wheel: dict) -> None:
    from conftest import SHARED_WHEEL_KERNELS

    [row] = plan_counts(["gfx942"], list(SHARED_WHEEL_KERNELS), list(VARIANTS),
                        shipped_table("gfx942"))  # fmt: skip
    assert gfx942_wheel["compiled"] == row["kernels"] == len(gfx942_wheel["results"])


@pytest.mark.parametrize("arch", ["gfx942", "gfx1100", "sm_90"])
def test_no_variant_is_compiled_twice(arch: str) -> None:
    """No two specs of any modules compile the same kernel with the same signature,
    constexprs and options (a build would pay twice for one cache entry)."""
    import json

    from greta_core.kernel_wheels.aot import discover

    seen: dict[tuple[str, ...], str] = {}
    for item in discover(arch):
        assert not item.error, item.error
        for spec in item.specs:
            fn = getattr(spec.kernel, "fn", spec.kernel)
            key = (f"{fn.__module__}.{fn.__name__}",
                   *(json.dumps(d, sort_keys=True, default=str)
                     for d in (spec.signature, spec.constexprs, spec.options,
                               spec.int_divisible)))  # fmt: skip
            assert key not in seen, (spec.name, seen.get(key))
            seen[key] = f"{item.module}:{spec.name}"
    assert len(seen) > 400
