"""matmul (C = a @ b + bias): the declaration of greta::matmul; every binding derives
from it. Both gradients are GEMMs through the same op."""

from __future__ import annotations

import itertools
from typing import Any

from greta_core import configs, reference
from greta_core.ops import _interp_compat
from greta_core.ops._plan import Buffer, In, Launch, Out, Plan, Wrap, _identity, memo, run
from greta_core.ops._rows import check_array_float
from greta_core.ops._validate import GretaInputError, check_same_device, check_tensor, launch_arch
from greta_core.ops.declare import Backward, Meta, OpDecl, declare

OP = "matmul"
_interp_compat.apply()


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


def validate(a: Any, b: Any, bias: Any | None = None, reference: bool = False) -> str:
    """Check the inputs and return the arch to launch on. Raises GretaInputError."""
    if reference:
        check_shapes(a, b, bias)
        return "reference"
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
    from greta_core.kernels.matmul import features, matmul_kernel  # plans import no Triton

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


def plan_metas(arch: str, a: Meta, b: Meta, bias: Meta | None) -> Plan:
    """The declaration's plan: a and b as given (any strides), c row-major."""
    (m, k), n = a.shape, b.shape[1]
    return plan(m, n, k, a.strides, b.strides, (n, 1), a.dtype, bias is not None, arch)


def launch(a: Any, b: Any, bias: Any | None, out: Any, arch: str, wrap: Wrap = _identity) -> None:
    """Launch into a preallocated `out` [m, n] (any strides); `wrap` is
    `torch.library.wrap_triton` inside a triton_op."""
    p = plan(
        a.shape[0], b.shape[1], a.shape[1], tuple(a.stride()), tuple(b.stride()),
        tuple(out.stride()), str(a.dtype).removeprefix("torch."), bias is not None, arch,
    )  # fmt: skip
    run(p, (a, b) if bias is None else (a, b, bias), out=(out,), wrap=wrap)


def check_arrays(a: Any, b: Any, bias: Any | None) -> None:
    """Raises GretaInputError unless a [M, K] @ b [K, N] (+ bias [N]) share a float dtype."""

    check_array_float("matmul", "a", a)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise GretaInputError(
            f"matmul: arguments 'a' {a.shape} and 'b' {b.shape} must be 2-D with "
            "a.shape[1] == b.shape[0]"
        )
    if a.dtype != b.dtype:
        raise GretaInputError(f"matmul: argument 'b' has dtype {b.dtype}; expected a's {a.dtype}")
    if bias is not None and (bias.shape != (b.shape[1],) or bias.dtype != a.dtype):
        raise GretaInputError(
            f"matmul: arguments 'bias' {bias.shape} {bias.dtype} must be ({b.shape[1]},) {a.dtype}"
        )


# --- what the kernel wheels precompile ------------------------------------------------------

# Shapes whose configs the kernel wheels precompile: one per rule of the tables (decode-
# sized M, mid-sized M, the large default), so each config a call can pick is covered.
AOT_SHAPES: tuple[tuple[int, int, int], ...] = (
    (64, 4096, 4096),
    (1024, 4096, 4096),
    (4096, 4096, 4096),
)
# The two layouts GRETA sees most: row-major A, B and C, and B given as w.t() (nn.Linear
# weights). Triton turns an int argument equal to 1 into a constant, so the specs name the
# unit strides these layouts have (the declaration's aot_unit_ints).
AOT_LAYOUTS = ("rowmajor", "b_transposed")


def _aot(arch: str) -> list[tuple[Any, ...]]:
    cases = []
    for (m, n, k), layout, dtype, has_bias in itertools.product(
        AOT_SHAPES, AOT_LAYOUTS, ("float16", "bfloat16"), (False, True)
    ):
        b = Meta.contiguous((k, n), dtype)
        if layout == "b_transposed":
            b = Meta((k, n), (1, k), dtype)
        bias = Meta.contiguous((n,), dtype) if has_bias else None
        cases.append((Meta.contiguous((m, k), dtype), b, bias))
    return cases


# --- the declaration ----------------------------------------------------------------------


def _grads(call: Any, grads: tuple[Any, ...], saved: Any) -> tuple[Any, ...]:
    # Both gradients are GEMMs through the same op, so compiled graphs keep the kernel.
    (g,) = grads
    a, b, needs = saved.a, saved.b, saved.needs_grad
    grad_a = call(MATMUL, g, b.T, None) if needs[0] else None
    grad_b = call(MATMUL, a.T, g, None) if needs[1] else None
    grad_bias = None
    if saved.bias is not None and needs[2]:
        grad_bias = reference.bias_grad(g)
    return grad_a, grad_b, grad_bias


MATMUL = declare(OpDecl(
    name=OP,
    schema="Tensor a, Tensor b, Tensor? bias=None -> Tensor",
    describe="GEMM a @ b (+ bias)",
    # A lambda: the module's validate as it is at call time (tests count its calls).
    validate=lambda *args, reference=False: validate(*args, reference=reference),
    plan=plan_metas,
    reference=reference.matmul,
    backward=Backward(_grads, saves=("a", "b", "bias")),
    check_arrays=check_arrays,
    aot_cases=_aot,
    kernel_dtypes=("float16", "bfloat16"),
    uses_matrix_units=True,
    aot_unit_ints=True,
))  # fmt: skip

# The call cache the torch front and tests reach; the hot path of the front.
_call = MATMUL.call


def matmul(
    a: Any, b: Any, bias: Any | None = None, out: Any | None = None, wrap: Wrap = _identity
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
    return MATMUL.if_eager(a, b, bias)
