from __future__ import annotations

from collections.abc import Callable
from typing import Any

from greta_core import configs
from greta_core.kernels.matmul import features, grid, matmul_kernel, needs_int64
from greta_core.observe import record
from greta_core.ops import _interp_compat
from greta_core.ops._validate import GretaInputError, check_same_device, check_tensor, launch_arch

Wrap = Callable[[Any], Any]


def _identity(kernel: Any) -> Any:
    return kernel


def _dtypes() -> tuple[Any, ...]:
    import torch

    return (torch.float16, torch.bfloat16)


def check_shapes(a: Any, b: Any, bias: Any | None) -> None:
    """Shape/dtype rules shared by the Triton path and the torch reference."""
    check_tensor("matmul", "a", a, ndim=2)
    check_tensor("matmul", "b", b, dtypes=(a.dtype,), ndim=2)
    if a.shape[1] != b.shape[0]:
        raise GretaInputError(
            f"matmul: argument 'b' has shape {tuple(b.shape)}; its first dimension must equal "
            f"a.shape[1] = {a.shape[1]} (a is {tuple(a.shape)})"
        )
    if bias is not None:
        check_tensor("matmul", "bias", bias, dtypes=(a.dtype,), ndim=1)
        if bias.shape[0] != b.shape[1]:
            raise GretaInputError(
                f"matmul: argument 'bias' has shape {tuple(bias.shape)}; expected ({b.shape[1]},)"
            )
    check_same_device("matmul", a=a, b=b, bias=bias)


def validate(a: Any, b: Any, bias: Any | None = None) -> str:
    """Check the inputs and return the arch to launch on."""
    check_tensor("matmul", "a", a, dtypes=_dtypes())
    check_shapes(a, b, bias)
    if bias is not None and bias.stride(0) != 1:
        raise GretaInputError("matmul: argument 'bias' must be contiguous")
    return launch_arch("matmul", a)


def _extent(t: Any) -> int:
    """One past the largest element offset reachable through `t`'s strides."""
    return 1 + sum(
        (size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride(), strict=True)
    )


def launch(a: Any, b: Any, bias: Any | None, out: Any, arch: str, wrap: Wrap = _identity) -> None:
    """Launch the kernel; `wrap` is `torch.library.wrap_triton` inside a triton_op."""
    m, k = a.shape
    n = b.shape[1]
    if m == 0 or n == 0:
        return
    if k == 0:
        # An empty sum: C is the bias (or zeros); no tile to compute.
        if bias is not None:
            out.copy_(bias.expand(m, n))
        else:
            out.zero_()
        record("matmul", "empty-k", arch)
        return
    if arch == "cpu":
        _interp_compat.apply()
    config = configs.lookup("matmul", arch, features(m, n, k))
    meta = configs.meta_params(config)
    wrap(matmul_kernel)[grid(m, n, meta["BLOCK_M"], meta["BLOCK_N"])](
        a,
        b,
        bias if bias is not None else a,  # never read when HAS_BIAS is False
        m,
        n,
        k,
        a.stride(0),
        a.stride(1),
        b.stride(0),
        b.stride(1),
        out.stride(0),
        out.stride(1),
        out,
        BLOCK_M=meta["BLOCK_M"],
        BLOCK_N=meta["BLOCK_N"],
        BLOCK_K=meta["BLOCK_K"],
        GROUP_M=meta["GROUP_M"],
        HAS_BIAS=bias is not None,
        EVEN_K=k % meta["BLOCK_K"] == 0,
        INT64=needs_int64(_extent(a), _extent(b), _extent(out)),
        UPCAST=arch == "cpu",
        **configs.launch_options(config, arch),
    )
    record("matmul", "triton-interpret" if arch == "cpu" else "triton", arch)


def matmul(a: Any, b: Any, bias: Any | None = None, out: Any | None = None) -> Any:
    """C = a @ b (+ bias) for 2-D fp16/bf16 tensors; any strides (e.g. ``w.t()``)."""
    arch = validate(a, b, bias)
    if out is None:
        import torch

        out = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
    else:
        check_tensor("matmul", "out", out, dtypes=(a.dtype,), ndim=2)
        if tuple(out.shape) != (a.shape[0], b.shape[1]):
            raise GretaInputError(
                f"matmul: argument 'out' has shape {tuple(out.shape)}; "
                f"expected {(a.shape[0], b.shape[1])}"
            )
    launch(a, b, bias, out, arch)
    return out
