from __future__ import annotations

from typing import Any

from greta_core import configs
from greta_core.kernels.matmul import features, matmul_kernel
from greta_core.ops import _interp_compat
from greta_core.ops._calls import ForwardCall, positions_as_given
from greta_core.ops._plan import Buffer, In, Launch, Out, Plan, Wrap, dtype_name, memo, run
from greta_core.ops._plan import _identity as _no_wrap
from greta_core.ops._validate import GretaInputError, check_same_device, check_tensor, launch_arch

OP = "matmul"


def _dtypes() -> tuple[Any, ...]:
    import torch

    return (torch.float16, torch.bfloat16)


def check_shapes(a: Any, b: Any, bias: Any | None) -> None:
    """Shape/dtype rules shared by the Triton path and the torch reference."""
    import torch

    # Float dtypes only, on every path: the reference would otherwise take int/bool tensors
    # the Triton path rejects (float32/float64 run the reference: gradcheck).
    floats = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    check_tensor("matmul", "a", a, dtypes=floats, ndim=2)
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
    """Check the inputs and return the arch to launch on. Raises GretaInputError."""
    check_tensor("matmul", "a", a, dtypes=_dtypes())
    check_shapes(a, b, bias)
    if bias is not None and bias.stride(0) != 1:
        raise GretaInputError("matmul: argument 'bias' must be contiguous")
    return launch_arch("matmul", a)


def needs_int64(*extents: int) -> bool:
    """Element offsets past 2**31 - 1 overflow Triton's default 32-bit index math."""
    return max(extents, default=0) >= 2**31


def _extent(shape: tuple[int, ...], strides: tuple[int, ...]) -> int:
    """One past the largest element offset reachable through `strides`."""
    return 1 + sum((size - 1) * abs(st) for size, st in zip(shape, strides, strict=True))


@memo
def plan(
    m: int, n: int, k: int, a_strides: tuple[int, int], b_strides: tuple[int, int],
    c_strides: tuple[int, int], dtype: str, has_bias: bool, arch: str,
) -> Plan:  # fmt: skip
    """Inputs (a, b[, bias]); buffer: c [m, n] in a's dtype. K = 0 runs the kernel too: an
    empty sum, so C is the bias (or zeros)."""
    config = configs.lookup(OP, arch, features(m, n, k))
    meta = configs.meta_params(config)
    int64 = needs_int64(
        _extent((m, k), a_strides), _extent((k, n), b_strides), _extent((m, n), c_strides)
    )
    tiles = ((m + meta["BLOCK_M"] - 1) // meta["BLOCK_M"]) * (
        (n + meta["BLOCK_N"] - 1) // meta["BLOCK_N"]
    )
    launch = Launch(
        matmul_kernel, (tiles,),
        # Without a bias the kernel gets a in its place (never read: HAS_BIAS is False).
        (In(0), In(1), In(2 if has_bias else 0), m, n, k, *a_strides, *b_strides, *c_strides,
         Out(0)),
        {
            "BLOCK_M": meta["BLOCK_M"], "BLOCK_N": meta["BLOCK_N"], "BLOCK_K": meta["BLOCK_K"],
            "GROUP_M": meta["GROUP_M"], "HAS_BIAS": has_bias, "EVEN_K": k % meta["BLOCK_K"] == 0,
            "INT64": int64, "UPCAST": arch == "cpu",
        },
        configs.launch_options(config, arch),
    )  # fmt: skip
    return Plan(OP, arch, (Buffer((m, n), dtype),), (launch,) if m and n else (), (0,))


def launch(a: Any, b: Any, bias: Any | None, out: Any, arch: str, wrap: Wrap = _no_wrap) -> None:
    """Launch into a preallocated `out` [m, n] (any strides); `wrap` is
    `torch.library.wrap_triton` inside a triton_op."""
    if arch == "cpu":
        _interp_compat.apply()
    p = plan(
        a.shape[0], b.shape[1], a.shape[1], tuple(a.stride()), tuple(b.stride()),
        tuple(out.stride()), dtype_name(a.dtype), bias is not None, arch,
    )  # fmt: skip
    run(p, (a, b) if bias is None else (a, b, bias), out=(out,), wrap=wrap)


def _resolve(a: Any, b: Any, bias: Any | None) -> tuple[Plan, tuple[int, ...]]:
    """(plan, positions in the call's (a, b, bias) of the plan's inputs): the bias only
    where one is given."""
    arch = validate(a, b, bias)
    if arch == "cpu":
        _interp_compat.apply()
    m, n = a.shape[0], b.shape[1]
    p = plan(
        m, n, a.shape[1], tuple(a.stride()), tuple(b.stride()), (n, 1), dtype_name(a.dtype),
        bias is not None, arch,
    )  # fmt: skip
    return p, (0, 1) if bias is None else (0, 1, 2)


# Call signature (a, b, bias): bias may be None (a slot of the key like any tensor). The
# plan takes a, b (any strides) and bias as given: every signature may launch ready.
_call = ForwardCall(_resolve, 3, *positions_as_given())


def matmul(
    a: Any, b: Any, bias: Any | None = None, out: Any | None = None, wrap: Wrap = _no_wrap
) -> Any:
    """C = a @ b (+ bias) for 2-D fp16/bf16 tensors; any strides (e.g. ``w.t()``).

    Raises GretaInputError for a wrong shape, dtype, device or layout.
    """
    if out is None:
        return _call.run(wrap, a, b, bias)[0]
    arch = validate(a, b, bias)
    check_tensor(OP, "out", out, dtypes=(a.dtype,), ndim=2)
    if tuple(out.shape) != (a.shape[0], b.shape[1]):
        raise GretaInputError(
            f"matmul: argument 'out' has shape {tuple(out.shape)}; "
            f"expected {(a.shape[0], b.shape[1])}"
        )
    launch(a, b, bias, out, arch, wrap)
    return out


def matmul_if_eager(a: Any, b: Any, bias: Any | None = None) -> Any | None:
    """:func:`matmul` for a call :func:`~greta_core.ops._calls.eager_raw` allows (the
    torch.ops front's hot path), else None: the caller then takes its torch op."""
    done = _call.if_eager(a, b, bias)
    return None if done is None else done[0]
