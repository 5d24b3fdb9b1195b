"""Element-wise add: the smallest kernel, used by the prototypes and the wheel tests.

Argument order follows the binding convention shared with jax-triton: input pointers,
then scalars, then output pointers, then constexprs.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def vec_add_kernel(x_ptr, y_ptr, n_elements, out_ptr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    # Added in fp32 and rounded once: the same result as a native fp16/bf16 add on a GPU
    # (fp32 holds more than twice their precision, so the double rounding is exact), and
    # Triton's CPU interpreter, which adds bf16 values as raw bit patterns (NaN, 1e37),
    # gets the sum right (its bf16 store truncates: within one bf16 ulp there).
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + offsets, mask=mask).to(tl.float32)
    tl.store(out_ptr + offsets, (x + y).to(out_ptr.dtype.element_ty), mask=mask)
