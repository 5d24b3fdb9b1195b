"""Input checks shared by the raw launchers: errors name the offending argument."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from greta_core.arch import arch_of, interpreter_active
from greta_core.errors import GretaInputError
from greta_core.kernel_wheels import precompiled


def check_tensor(
    op: str,
    name: str,
    t: Any,
    *,
    dtypes: Iterable[Any] | None = None,
    ndim: int | Iterable[int] | None = None,
    contiguous: bool = False,
) -> None:
    if not hasattr(t, "data_ptr") or not hasattr(t, "shape"):
        raise GretaInputError(f"{op}: argument '{name}' must be a tensor, got {type(t).__name__}")
    if dtypes is not None:
        allowed = tuple(dtypes)
        if t.dtype not in allowed:
            names = ", ".join(str(d).replace("torch.", "") for d in allowed)
            raise GretaInputError(
                f"{op}: argument '{name}' has dtype {str(t.dtype).replace('torch.', '')}; "
                f"expected one of: {names}"
            )
    if ndim is not None:
        allowed_ndim = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if t.dim() not in allowed_ndim:
            raise GretaInputError(
                f"{op}: argument '{name}' has {t.dim()} dimensions (shape {tuple(t.shape)}); "
                f"expected {' or '.join(map(str, allowed_ndim))}"
            )
    if contiguous and not t.is_contiguous():
        raise GretaInputError(
            f"{op}: argument '{name}' must be contiguous (call .contiguous() first)"
        )


def check_same_device(op: str, **tensors: Any) -> None:
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    first = next(iter(devices.values()), None)
    if any(device != first for device in devices.values()):
        listing = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise GretaInputError(f"{op}: all tensors must be on one device; got {listing}")


def check_same_shape(op: str, **tensors: Any) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items() if t is not None}
    # Pairwise ==, not a set: under torch.compile shapes hold unhashable SymInts.
    first = next(iter(shapes.values()), ())
    if any(shape != first for shape in shapes.values()):
        listing = ", ".join(f"{n}{list(s)}" for n, s in shapes.items())
        raise GretaInputError(f"{op}: shapes must match; got {listing}")


def launch_arch(op: str, t: Any) -> str:
    """Arch to launch on for tensor `t`; a CPU tensor needs the Triton interpreter."""
    arch = arch_of(t)
    if arch == "cpu" and not interpreter_active():
        raise GretaInputError(
            f"{op}: the raw Triton kernels need GPU tensors (got a CPU tensor). Use "
            f"torch.ops.greta.{op} (CPU reference) or set TRITON_INTERPRET=1 before importing triton."
        )
    if arch != "cpu":
        # Serve kernel-wheel binaries to the JIT; after the first call this is a flag test.
        precompiled.activate()
    return arch
