"""Column sums of a [P, N] fp32 partials buffer: the deterministic second stage of the
weight/bias gradients of the norms (each backward program writes one partial row; this
adds them in a fixed order, so results do not depend on scheduling).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def col_sum_kernel(
    partial_ptr,
    n_partials,
    n_cols,
    out_ptr,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    acc = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
    for start in range(0, n_partials, BLOCK_P):
        rows = start + tl.arange(0, BLOCK_P)
        mask = (rows[:, None] < n_partials) & col_mask[None, :]
        ptrs = partial_ptr + rows[:, None] * n_cols + cols[None, :]
        acc += tl.load(ptrs, mask=mask, other=0.0)
    total = tl.sum(acc, axis=0)
    tl.store(out_ptr + cols, total.to(out_ptr.dtype.element_ty), mask=col_mask)


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
            },
            constexprs={"BLOCK_P": config["BLOCK_P"], "BLOCK_N": config["BLOCK_N"]},
            options=configs.launch_options(config, arch),
        )
        for dtype in ("fp32", "fp16", "bf16")
    ]
