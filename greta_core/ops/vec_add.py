from __future__ import annotations

from collections.abc import Callable
from typing import Any

from greta_core import configs
from greta_core.kernels.vec_add import grid, vec_add_kernel
from greta_core.observe import record
from greta_core.ops._validate import (
    check_same_device,
    check_same_shape,
    check_tensor,
    launch_arch,
)

Wrap = Callable[[Any], Any]


def _identity(kernel: Any) -> Any:
    return kernel


def validate(x: Any, y: Any) -> str:
    """Check the inputs and return the arch to launch on."""
    check_tensor("vec_add", "x", x, contiguous=True)
    check_tensor("vec_add", "y", y, dtypes=(x.dtype,), contiguous=True)
    check_same_shape("vec_add", x=x, y=y)
    check_same_device("vec_add", x=x, y=y)
    return launch_arch("vec_add", x)


def launch(x: Any, y: Any, out: Any, arch: str, wrap: Wrap = _identity) -> None:
    """Launch the kernel; `wrap` is `torch.library.wrap_triton` inside a triton_op."""
    n = x.numel()
    config = configs.lookup("vec_add", arch, {"n": n})
    block = config["BLOCK"]
    wrap(vec_add_kernel)[grid(n, block)](
        x, y, n, out, BLOCK=block, **configs.launch_options(config, arch)
    )
    record("vec_add", "triton-interpret" if arch == "cpu" else "triton", arch)


def vec_add(x: Any, y: Any, out: Any | None = None) -> Any:
    """out = x + y for contiguous tensors of one shape, dtype and device."""
    arch = validate(x, y)
    if out is None:
        import torch

        out = torch.empty_like(x)
    else:
        check_tensor("vec_add", "out", out, dtypes=(x.dtype,), contiguous=True)
        check_same_shape("vec_add", x=x, out=out)
    launch(x, y, out, arch)
    return out
