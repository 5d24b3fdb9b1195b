"""Column sums of a [P, N] fp32 partials buffer: the deterministic second stage of the
weight/bias gradients of the norms (each backward program writes one partial row; this
adds them in a fixed order, so results do not depend on scheduling). The order is
``_rows.sum_partials``': row 0, 1, ..., P-1 per column, whatever the layout, the one a norm
backward's last program uses when it adds the partials itself (``REDUCE_LAST``).

A grid of two in its second dim sums two such buffers laid end to end ([2, P, N]: layer_norm's
dweight and dbias partials) into ``out_ptr`` and ``out2_ptr``: one launch, not two. With a
grid of one (rms_norm's dweight alone) the one sum goes to both: torch callers pass
``out_ptr`` twice (the same values stored twice by the same thread), while under JAX,
where each output parameter is a buffer of its own, the plan's result is the last one.
"""

from __future__ import annotations

import triton
import triton.language as tl

from greta_core.kernels._rows import sum_partials


@triton.jit
def col_sum_kernel(
    partial_ptr,
    n_partials,
    n_cols,
    out_ptr,
    out2_ptr,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)
    second = tl.program_id(1)
    partial_ptr += second * n_partials * n_cols
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    acc = sum_partials(partial_ptr, n_partials, n_cols, cols, col_mask, BLOCK_N, BLOCK_P)
    total = acc.to(out_ptr.dtype.element_ty)
    # Masked stores, not a pointer picked by a branch: the first sum goes to out_ptr, the
    # last to out2_ptr (both in one dtype: a norm's weight and bias).
    tl.store(out_ptr + cols, total, mask=col_mask & (second == 0))
    tl.store(out2_ptr + cols, total, mask=col_mask & (second == tl.num_programs(1) - 1))


def aot_specs(arch: str) -> list:
    from greta_core import configs
    from greta_core.kernels._aot import AotSpec

    config = configs.lookup("col_sum", arch, {})
    return [
        AotSpec(
            name=f"col_sum[{dtype}]",
            kernel=col_sum_kernel,
            signature={
                "partial_ptr": "*fp32",
                "n_partials": "i32",
                "n_cols": "i32",
                "out_ptr": f"*{dtype}",
                "out2_ptr": f"*{dtype}",
            },
            constexprs={"BLOCK_P": config["BLOCK_P"], "BLOCK_N": config["BLOCK_N"]},
            options=configs.launch_options(config, arch),
        )
        for dtype in ("fp32", "fp16", "bf16")
    ]
