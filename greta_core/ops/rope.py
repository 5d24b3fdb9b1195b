from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from greta_core.kernels.rope import grid, plan, rope_kernel, rope_positions_kernel
from greta_core.observe import record
from greta_core.ops import _interp_compat
from greta_core.ops._rows import arch_for, float_dtypes, param_dtypes
from greta_core.ops._validate import (
    GretaInputError,
    check_same_device,
    check_tensor,
)

Wrap = Callable[[Any], Any]
_interp_compat.apply()


def _identity(kernel: Any) -> Any:
    return kernel


def _impl(arch: str) -> str:
    return "triton-interpret" if arch == "cpu" else "triton"


def check_x(op: str, x: Any, reference: bool = False) -> None:
    check_tensor(op, "x", x, dtypes=float_dtypes(reference), ndim=4)
    if x.shape[-1] % 2:
        raise GretaInputError(
            f"{op}: argument 'x' has head_dim {x.shape[-1]}; RoPE needs an even head_dim "
            "(layout [batch, seq, heads, head_dim])"
        )


def _check_batch(op: str, name: str, t: Any, batch: int, seq: int, tail: tuple[int, ...]) -> None:
    lead = tuple(t.shape[: t.dim() - len(tail)])
    ok = tuple(t.shape[t.dim() - len(tail) :]) == tail and (
        lead == (seq,) or (len(lead) == 2 and lead[0] in (1, batch) and lead[1] == seq)
    )
    if not ok:
        want = ", ".join(map(str, tail))
        sep = ", " if tail else ""
        raise GretaInputError(
            f"{op}: argument '{name}' has shape {tuple(t.shape)}; expected ({seq}{sep}{want}) "
            f"or ({batch} or 1, {seq}{sep}{want})"
        )


def validate(x: Any, cos: Any, sin: Any, reference: bool = False) -> str:
    check_x("rope", x, reference)
    batch, seq, _, head_dim = x.shape
    for name, t in (("cos", cos), ("sin", sin)):
        check_tensor("rope", name, t, dtypes=param_dtypes(x.dtype), ndim=(2, 3))
        _check_batch("rope", name, t, batch, seq, (head_dim // 2,))
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            raise GretaInputError(f"rope: argument '{name}' must be contiguous in its last dim")
    check_tensor("rope", "sin", sin, dtypes=(cos.dtype,))
    if tuple(sin.shape) != tuple(cos.shape) or sin.stride() != cos.stride():
        raise GretaInputError(
            f"rope: arguments 'cos' {tuple(cos.shape)} and 'sin' {tuple(sin.shape)} must share "
            "shape and strides"
        )
    check_same_device("rope", x=x, cos=cos, sin=sin)
    return arch_for("rope", x, reference)


def validate_positions(x: Any, positions: Any, theta: float, reference: bool = False) -> str:
    import torch

    check_x("rope_positions", x, reference)
    check_tensor("rope_positions", "positions", positions, dtypes=(torch.int32, torch.int64))
    _check_batch("rope_positions", "positions", positions, x.shape[0], x.shape[1], ())
    if not (isinstance(theta, (int, float)) and math.isfinite(theta) and theta > 1.0):
        raise GretaInputError(
            f"rope_positions: argument 'theta' must be a float > 1, got {theta!r}"
        )
    check_same_device("rope_positions", x=x, positions=positions)
    return arch_for("rope_positions", x, reference)


def _batch_strides(t: Any, n_tail: int) -> tuple[int, int]:
    """(stride over batch, stride over seq); batch stride 0 broadcasts a missing/size-1 batch."""
    if t.dim() == n_tail + 1:
        return 0, t.stride(0)
    return (0 if t.shape[0] == 1 else t.stride(0)), t.stride(1)


def launch(
    x: Any, cos: Any, sin: Any, out: Any, arch: str, inverse: bool = False,
    wrap: Wrap = _identity,
) -> None:  # fmt: skip
    batch, seq, heads, head_dim = x.shape
    if x.numel() == 0:
        return
    block_h, block_half, options = plan(arch, heads, head_dim)
    scb, scs = _batch_strides(cos, 1)
    wrap(rope_kernel)[grid(batch, seq, heads, block_h)](
        x, cos, sin, seq, heads, head_dim // 2, *x.stride(), scb, scs, *out.stride()[:3], out,
        BLOCK_H=block_h, BLOCK_HALF=block_half, INVERSE=inverse, **options,
    )  # fmt: skip
    record("rope", _impl(arch), arch)


def launch_positions(
    x: Any, positions: Any, theta: float, out: Any, arch: str, inverse: bool = False,
    wrap: Wrap = _identity,
) -> None:  # fmt: skip
    batch, seq, heads, head_dim = x.shape
    if x.numel() == 0:
        return
    block_h, block_half, options = plan(arch, heads, head_dim)
    spb, sps = _batch_strides(positions, 0)
    wrap(rope_positions_kernel)[grid(batch, seq, heads, block_h)](
        x, positions, seq, heads, head_dim // 2, *x.stride(), spb, sps, math.log2(theta),
        *out.stride()[:3], out,
        BLOCK_H=block_h, BLOCK_HALF=block_half, INVERSE=inverse, **options,
    )  # fmt: skip
    record("rope_positions", _impl(arch), arch)


def rope(x: Any, cos: Any, sin: Any, *, inverse: bool = False) -> Any:
    """Rotate-half RoPE of x [batch, seq, heads, head_dim] (any strides) by cos/sin
    ([seq, head_dim/2] or [batch|1, seq, head_dim/2]); inverse=True rotates back."""
    import torch

    arch = validate(x, cos, sin)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    launch(x, cos, sin, out, arch, inverse)
    return out


def rope_positions(x: Any, positions: Any, theta: float = 10000.0, *, inverse: bool = False) -> Any:
    """RoPE with angle pos * theta^(-2i/head_dim) computed in the kernel; positions int32/int64
    [seq] or [batch|1, seq]."""
    import torch

    arch = validate_positions(x, positions, theta)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    launch_positions(x, positions, float(theta), out, arch, inverse)
    return out
