"""Host time of the raw eager path on the CPU, with the GPU launch stubbed out.

What it measures: ``greta_core.raw.*`` on small CPU tensors as if they were GPU tensors
(the launch arch forced to sm_90, Triton's compiled kernel replaced by a stand-in whose
launcher does nothing), so validation caching, planning, allocation, key building and the
direct launcher's Python side are timed without a GPU. Run it once per tree to compare:

    PYTHONPATH=old python bench/eager_host_cpu.py --label before
    PYTHONPATH=.   python bench/eager_host_cpu.py --label after

Each case: the minimum over ``--batches`` batches of ``--calls`` calls (the minimum is the
least disturbed by other processes on a shared machine). Not a GPU number: the GPU host
cost is measured by bench/binding_overhead.py on the GPU machine.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any


def _stub_gpu() -> None:
    """Force the GPU launch path on CPU tensors with a no-op compiled kernel."""
    from triton import knobs
    from triton.runtime.jit import JITFunction

    import greta_core.ops._direct as direct
    import greta_core.ops._rows as rows
    import greta_core.ops.attention as attention_ops
    import greta_core.ops.matmul as matmul_ops
    import greta_core.ops.vec_add as vec_add
    from greta_core.kernels import add_rms_norm, attention, layer_norm, rms_norm, rope, softmax
    from greta_core.kernels import matmul as matmul_kernels
    from greta_core.kernels import vec_add as vec_add_kernels

    class Compiled:  # what JITFunction.run returns, launching nothing
        function, packed_metadata = 1, (4, 1, 0)

        def __init__(self) -> None:
            self.run = lambda *a: None

    compiled = Compiled()
    hook_chain = getattr(knobs, "HookChain", None)
    stub = direct.Support(JITFunction, Compiled, hook_chain, knobs, False)
    direct.support = lambda: stub
    direct._driver = lambda: ((lambda: 0), (lambda d: 0))
    rows.launch_arch = lambda op, t: "sm_90"
    vec_add.launch_arch = lambda op, t: "sm_90"
    attention_ops.launch_arch = lambda op, t: "sm_90"
    matmul_ops.launch_arch = lambda op, t: "sm_90"
    kernels = (
        rms_norm, softmax, vec_add_kernels, layer_norm, add_rms_norm, rope, attention,
        matmul_kernels,
    )  # fmt: skip
    for module in kernels:
        for name in dir(module):
            if type(kernel := getattr(module, name)) is JITFunction:
                kernel.run = lambda *a, **kw: compiled


def host_us(fn: Callable[[], Any], calls: int, batches: int) -> float:
    for _ in range(200):
        fn()
    best = float("inf")
    for _ in range(batches):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", required=True)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--batches", type=int, default=200)
    args = parser.parse_args(argv)
    import torch

    _stub_gpu()
    from greta_core import raw
    from greta_core.ops._calls import eager_raw

    x, r = torch.randn(4, 64, dtype=torch.bfloat16), torch.randn(4, 64, dtype=torch.bfloat16)
    w, b = torch.randn(64, dtype=torch.bfloat16), torch.randn(64, dtype=torch.bfloat16)
    # rope on HF's transposed q ([B, H, S, D] seen as [B, S, H, D]), half tables [B, S, D/2];
    # attention as a 1B Llama's decode step (32 query heads over 8, 512 cached tokens).
    xr = torch.randn(1, 32, 1, 64, dtype=torch.bfloat16).transpose(1, 2)
    cos, sin = (torch.randn(1, 1, 64, dtype=torch.bfloat16)[..., :32] for _ in range(2))
    q = torch.randn(1, 32, 1, 64, dtype=torch.bfloat16)
    k, v = (torch.randn(1, 8, 512, 64, dtype=torch.bfloat16) for _ in range(2))
    # matmul as F.linear: a decode step's hidden [1, 64] times a weight's transpose.
    h, weight = torch.randn(1, 64, dtype=torch.bfloat16), torch.randn(128, 64, dtype=torch.bfloat16)
    cases: dict[str, Callable[[], Any]] = {
        "raw.rms_norm": lambda: raw.rms_norm(x, w, 1e-6),
        "raw.softmax": lambda: raw.softmax(x),
        "raw.vec_add": lambda: raw.vec_add(x, x),
        "raw.layer_norm": lambda: raw.layer_norm(x, w, b, 1e-5),
        "raw.add_rms_norm": lambda: raw.add_rms_norm(x, r, w, 1e-6),
        "raw.rope": lambda: raw.rope(xr, cos, sin),
        "raw.attention (GQA decode)": lambda: raw.attention(q, k, v),
        "raw.matmul (x @ w.t())": lambda: raw.matmul(h, weight.t()),
        "eager_raw(x, w)": lambda: eager_raw(x, w),
        "torch.empty x2 (alloc floor)": lambda: (
            torch.empty((4, 64), dtype=torch.bfloat16, device=x.device),
            torch.empty((4,), dtype=torch.float32, device=x.device),
        ),
    }
    for name, fn in cases.items():
        print(f"{args.label:8} {name:30} {host_us(fn, args.calls, args.batches):8.2f} us/call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
