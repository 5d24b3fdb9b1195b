"""Cross-entropy rows of one chunk of logits, gradient written in place.

The fused linear cross-entropy never holds the logits of all tokens: per chunk of tokens
it computes ``logits = hidden_chunk @ weight.T`` (a GEMM), then this kernel reads each
logits row twice (online max / sum-exp, then the gradient) and overwrites it with
``dlogits = scale * (softmax(logits) - onehot(target))``, so the chunk's GEMMs for the
hidden and weight gradients read it straight back. Rows whose target is ``ignore_index``
get loss 0 and a zero gradient. ``scale`` is a device scalar (ROW_SCALE=False: 1/n_valid
for a mean, 1 for a sum, read on the device so the host never syncs) or one value per row
(ROW_SCALE=True: the incoming gradient of reduction="none"). fp32 math for every dtype.
"""

from __future__ import annotations

import triton
import triton.language as tl

DTYPES = ("fp32", "fp16", "bf16")


@triton.jit
def cross_entropy_rows_kernel(
    target_ptr,
    scale_ptr,
    logits_in_ptr,
    n_cols,
    stride_l,
    ignore_index,
    loss_ptr,
    logits_ptr,
    BLOCK_V: tl.constexpr,
    WRITE_GRAD: tl.constexpr,
    ROW_SCALE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    # The logits are read through their input pointer and dlogits written through the output
    # one: the same memory (the plan aliases them), but jax-triton aliases an output only to
    # an input the kernel takes.
    src = logits_in_ptr + row * stride_l
    base = logits_ptr + row * stride_l
    target = tl.load(target_ptr + row).to(tl.int64)
    if target == ignore_index:
        if WRITE_GRAD:
            for start in range(0, n_cols, BLOCK_V):
                cols = start + tl.arange(0, BLOCK_V)
                zero = tl.zeros((BLOCK_V,), dtype=tl.float32)
                tl.store(base + cols, zero.to(logits_ptr.dtype.element_ty), mask=cols < n_cols)
        tl.store(loss_ptr + row, 0.0)
    else:
        m = tl.full([], float("-inf"), tl.float32)
        d = tl.full([], 0.0, tl.float32)
        for start in range(0, n_cols, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            x = tl.load(src + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, axis=0))
            d = d * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
            m = m_new
        lse = m + tl.log(d)
        x_target = tl.load(src + target).to(tl.float32)
        tl.store(loss_ptr + row, lse - x_target)
        if WRITE_GRAD:
            if ROW_SCALE:
                scale = tl.load(scale_ptr + row).to(tl.float32)
            else:
                scale = tl.load(scale_ptr).to(tl.float32)
            for start in range(0, n_cols, BLOCK_V):
                cols = start + tl.arange(0, BLOCK_V)
                mask = cols < n_cols
                x = tl.load(src + cols, mask=mask, other=0.0).to(tl.float32)
                p = tl.exp(x - lse)
                g = tl.where(cols == target, p - 1.0, p) * scale
                # Same offsets as the load: each thread overwrites only what it read.
                tl.store(base + cols, g.to(logits_ptr.dtype.element_ty), mask=mask)


@triton.jit
def scale_in_place_kernel(x_ptr, scale_ptr, n, out_ptr, BLOCK: tl.constexpr):
    """``x *= scale`` (a device scalar), fp32 math; nothing at all where scale is 1.

    The backward of a training step scales the gradients the forward computed by the loss's
    incoming gradient, which ``loss.backward()`` makes exactly 1: each program then reads one
    float and returns, instead of a pass over the [vocab, hidden] weight gradient. Any other
    value (NaN included) scales every element, as a multiply would."""
    scale = tl.load(scale_ptr).to(tl.float32)
    if scale != 1.0:
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
        tl.store(out_ptr + offs, (x * scale).to(out_ptr.dtype.element_ty), mask=mask)


def grid(n_rows: int) -> tuple[int]:
    return (n_rows,)


def scale_grid(n: int, block: int) -> tuple[int]:
    return (max(1, -(-n // block)),)


def aot_specs(arch: str) -> list:
    from greta_core import configs
    from greta_core.kernels._aot import AotSpec

    config = configs.lookup("linear_cross_entropy", arch, {})
    options = configs.launch_options(config, arch)
    specs = []
    for dtype in DTYPES:
        for write_grad, row_scale in ((False, False), (True, False), (True, True)):
            specs.append(
                AotSpec(
                    name=(
                        f"cross_entropy_rows[{dtype},BLOCK_V={config['BLOCK_V']},"
                        f"grad={write_grad},row_scale={row_scale}]"
                    ),
                    kernel=cross_entropy_rows_kernel,
                    signature={
                        "target_ptr": "*i64",
                        "scale_ptr": "*fp32",
                        "logits_in_ptr": f"*{dtype}",
                        "n_cols": "i32",
                        "stride_l": "i64",
                        "ignore_index": "i64",
                        "loss_ptr": "*fp32",
                        "logits_ptr": f"*{dtype}",
                    },
                    constexprs={
                        "BLOCK_V": config["BLOCK_V"],
                        "WRITE_GRAD": write_grad,
                        "ROW_SCALE": row_scale,
                    },
                    options=options,
                )
            )
        specs.append(
            AotSpec(
                name=f"scale_in_place[{dtype},BLOCK={config['BLOCK_V']}]",
                kernel=scale_in_place_kernel,
                signature={
                    "x_ptr": f"*{dtype}",
                    "scale_ptr": "*fp32",
                    "n": "i32",
                    "out_ptr": f"*{dtype}",
                },
                constexprs={"BLOCK": config["BLOCK_V"]},
                options=options,
            )
        )
    return specs
