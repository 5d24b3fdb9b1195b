"""What ahead-of-time compilation needs to know about a kernel.

Each kernel module exposes ``aot_specs(arch) -> list[AotSpec]``: the signature
specialisations GRETA launches (pointer dtypes, scalar types) and the constexprs the
arch's config table picks. ``greta_core.kernel_wheels.aot`` compiles them for any arch without a GPU;
kernel wheels carry the results.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class AotSpec:
    name: str  # unique, e.g. "vec_add[fp32]"
    kernel: Any  # the @triton.jit function
    signature: dict[str, str]  # arg -> Triton type ("*fp16", "i32", "fp32"), runtime args only
    constexprs: dict[str, Any]  # constexpr arg -> value
    options: dict[str, Any] = field(default_factory=dict)  # num_warps, num_stages, HIP knobs
    uses_matrix_units: bool = False  # GEMM/attention: the AOT report checks for MFMA/WMMA/wgmma
    # The int args of the call this spec was derived from: divisible by 16 or not (Triton's
    # JIT specialises on it). None: the build's int variants ("aligned", "ragged") decide.
    int_divisible: dict[str, bool] | None = None
