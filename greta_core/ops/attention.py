from __future__ import annotations

import math
from typing import Any

from greta_core import configs
from greta_core.kernels.attention import attention_fwd_kernel, features
from greta_core.ops import _interp_compat
from greta_core.ops._calls import ForwardCall, positions_as_given
from greta_core.ops._plan import Buffer, In, Launch, Out, Plan, Wrap, dtype_name, memo, run
from greta_core.ops._plan import _identity as _no_wrap
from greta_core.ops._validate import GretaInputError, check_same_device, check_tensor, launch_arch

OP = "attention"
HEAD_DIMS: tuple[int, ...] = (64, 128)
# Every path (Triton, torch reference, CPU or GPU) takes float tensors only; fp32/fp64 run
# the torch reference (gradcheck), fp16/bf16 the kernel.
KERNEL_DTYPE_NAMES = ("float16", "bfloat16")


def check_shapes(
    q: Any, k: Any, v: Any, q_lens: Any | None = None, kv_lens: Any | None = None, *,
    dtypes: tuple[Any, ...] | None = None,
) -> None:  # fmt: skip
    """Shape/dtype rules shared by the Triton path and the torch reference.

    Raises GretaInputError. Lengths on the CPU are checked for negative values (free there;
    on a GPU it would cost a sync per call: the kernel treats a negative length as 0).
    """
    import torch

    if dtypes is None:
        dtypes = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    check_tensor("attention", "q", q, dtypes=dtypes, ndim=4)
    check_tensor("attention", "k", k, dtypes=(q.dtype,), ndim=4)
    check_tensor("attention", "v", v, dtypes=(q.dtype,), ndim=4)
    batch, heads_q, _, dim = q.shape
    if k.shape[0] != batch or k.shape[3] != dim:
        raise GretaInputError(
            f"attention: argument 'k' has shape {tuple(k.shape)}; expected [B={batch}, Hkv, "
            f"Skv, D={dim}] to go with q {tuple(q.shape)}"
        )
    if tuple(v.shape) != tuple(k.shape):
        raise GretaInputError(
            f"attention: argument 'v' has shape {tuple(v.shape)}; expected k's {tuple(k.shape)}"
        )
    if dim == 0:  # the default scale is 1/sqrt(D)
        raise GretaInputError(
            f"attention: argument 'q' has shape {tuple(q.shape)}; its head dim must be >= 1"
        )
    heads_kv = k.shape[1]
    if heads_kv == 0 or heads_q % heads_kv != 0:
        raise GretaInputError(
            f"attention: argument 'k' has {heads_kv} heads; q's {heads_q} heads must be a "
            "multiple of it (grouped-query attention)"
        )
    for name, lens in (("q_lens", q_lens), ("kv_lens", kv_lens)):
        if lens is None:
            continue
        check_tensor("attention", name, lens, dtypes=(torch.int32,), ndim=1)
        if lens.shape[0] != batch:
            raise GretaInputError(
                f"attention: argument '{name}' has shape {tuple(lens.shape)}; expected ({batch},)"
            )
    check_same_device("attention", q=q, k=k, v=v, q_lens=q_lens, kv_lens=kv_lens)
    check_length_values(q_lens, kv_lens)


def check_length_values(q_lens: Any | None, kv_lens: Any | None) -> None:
    """Negative lengths of real CPU tensors (a traced, fake, one has no values to read).
    Value checks, not signature ones: the raw API runs this on every call, cached or not."""
    import torch

    for name, lens in (("q_lens", q_lens), ("kv_lens", kv_lens)):
        concrete = type(lens) is torch.Tensor and lens.device.type == "cpu"
        if concrete and lens.numel() and int(lens.min()) < 0:
            raise GretaInputError(
                f"attention: argument '{name}' holds a negative length ({int(lens.min())})"
            )


def validate(q: Any, k: Any, v: Any, q_lens: Any | None = None, kv_lens: Any | None = None) -> str:
    """Check the inputs and return the arch to launch on. Raises GretaInputError."""
    import torch

    check_shapes(q, k, v, q_lens, kv_lens, dtypes=(torch.float16, torch.bfloat16))
    if q.shape[3] not in HEAD_DIMS:
        raise GretaInputError(
            f"attention: argument 'q' has head dim {q.shape[3]}; the Triton kernel supports "
            f"{', '.join(map(str, HEAD_DIMS))}"
        )
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(3) != 1:
            raise GretaInputError(
                f"attention: argument '{name}' must have a contiguous last (head) dimension"
            )
    for name, lens in (("q_lens", q_lens), ("kv_lens", kv_lens)):
        if lens is not None and not lens.is_contiguous():
            raise GretaInputError(f"attention: argument '{name}' must be contiguous")
    return launch_arch("attention", q)


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)


def _lens_args(batch: int, seq_q: int, seq_kv: int, lens: str) -> tuple[tuple, tuple]:
    """(q_lens, kv_lens) arguments and the extra buffers they need. `lens`: which of the two
    the call gave ("", "q", "kv", "q+kv"); a missing one is the full length of its axis."""
    if not lens:
        return (In(0), In(0)), ()  # never read: HAS_LENS is False
    if lens == "q+kv":
        return (In(3), In(4)), ()
    full = Buffer((batch,), "int32", fill=seq_kv if lens == "q" else seq_q)
    return ((In(3), Out(2)) if lens == "q" else (Out(2), In(3))), (full,)


@memo
def plan_fwd(
    q_shape: tuple[int, ...], kv_heads_seq: tuple[int, int],
    strides: tuple[tuple[int, ...], ...], dtype: str, causal: bool, scale: float | None,
    lens: str, arch: str,
) -> Plan:  # fmt: skip
    """Inputs (q, k, v[, q_lens][, kv_lens]); `strides`: the [:3] strides of q, k, v.
    Buffers: o [B, Hq, Sq, D] (q's dtype), lse [B, Hq, Sq] fp32 (natural log)."""
    batch, heads_q, seq_q, dim = q_shape
    heads_kv, seq_kv = kv_heads_seq
    config = configs.lookup(OP, arch, features(dim, seq_q, seq_kv, causal))
    meta = configs.meta_params(config)
    lens_args, extra = _lens_args(batch, seq_q, seq_kv, lens)
    out_strides = (heads_q * seq_q * dim, seq_q * dim, dim)
    launch = Launch(
        attention_fwd_kernel,
        ((seq_q + meta["BLOCK_M"] - 1) // meta["BLOCK_M"], batch * heads_q),
        (In(0), In(1), In(2), *lens_args, default_scale(dim) if scale is None else float(scale),
         seq_q, seq_kv, heads_q, heads_q // heads_kv, *(s for st in strides for s in st),
         *out_strides, Out(0), Out(1)),
        {"HEAD_DIM": dim, "BLOCK_M": meta["BLOCK_M"], "BLOCK_N": meta["BLOCK_N"],
         "CAUSAL": bool(causal), "HAS_LENS": bool(lens), "UPCAST": arch == "cpu"},
        configs.launch_options(config, arch),
    )  # fmt: skip
    buffers = (Buffer(q_shape, dtype), Buffer((batch, heads_q, seq_q), "float32"), *extra)
    return Plan(OP, arch, buffers, (launch,) if batch * heads_q * seq_q else (), (0, 1))


def lens_key(q_lens: Any | None, kv_lens: Any | None) -> str:
    return "+".join(n for n, t in (("q", q_lens), ("kv", kv_lens)) if t is not None)


def _plan_for(q: Any, k: Any, v: Any, causal: bool, scale: float | None, lens: str, arch: str):
    strides = tuple(tuple(t.stride()[:3]) for t in (q, k, v))
    return plan_fwd(
        tuple(q.shape), (k.shape[1], k.shape[2]), strides, dtype_name(q.dtype), bool(causal),
        None if scale is None else float(scale), lens, arch,
    )  # fmt: skip


def _inputs(q: Any, k: Any, v: Any, q_lens: Any | None, kv_lens: Any | None) -> tuple:
    return (q, k, v, *(t for t in (q_lens, kv_lens) if t is not None))


def launch(
    q: Any, k: Any, v: Any, causal: bool, scale: float | None, q_lens: Any | None,
    kv_lens: Any | None, out: Any, lse: Any, arch: str, wrap: Wrap = _no_wrap,
) -> None:  # fmt: skip
    """Run into preallocated `out` [B, Hq, Sq, D] (contiguous) and `lse` [B, Hq, Sq] fp32."""
    if arch == "cpu":
        _interp_compat.apply()
    plan = _plan_for(q, k, v, causal, scale, lens_key(q_lens, kv_lens), arch)
    run(plan, _inputs(q, k, v, q_lens, kv_lens), out=(out, lse), wrap=wrap)


def _resolve(
    q: Any, k: Any, v: Any, q_lens: Any | None, kv_lens: Any | None, causal: bool,
    scale: float | None,
) -> tuple[Plan, tuple[int, ...]]:  # fmt: skip
    """(plan, positions in the call's arguments of the plan's inputs) for one signature."""
    arch = validate(q, k, v, q_lens, kv_lens)
    if arch == "cpu":
        _interp_compat.apply()
    plan = _plan_for(q, k, v, causal, scale, lens_key(q_lens, kv_lens), arch)
    given = (q_lens, kv_lens)
    return plan, (0, 1, 2, *(3 + i for i in (0, 1) if given[i] is not None))


# Call signature (q, k, v, q_lens, kv_lens, causal, scale): the lengths may be None. The
# plan takes q, k, v and the lengths as given; a plan that fills a missing length vector
# has a buffer that is no plain result, and ForwardCall keeps no ready launch for it.
_fwd_call = ForwardCall(_resolve, 5, *positions_as_given())


def attention_with_lse(
    q: Any, k: Any, v: Any, causal: bool = False, scale: float | None = None,
    q_lens: Any | None = None, kv_lens: Any | None = None, wrap: Wrap = _no_wrap,
) -> tuple[Any, Any]:  # fmt: skip
    """(o [B, Hq, Sq, D], logsumexp [B, Hq, Sq] fp32 in natural log).

    Raises GretaInputError for a wrong shape, dtype, device, layout or length.
    """
    if q_lens is not None or kv_lens is not None:
        check_length_values(q_lens, kv_lens)
    return _fwd_call.run(wrap, q, k, v, q_lens, kv_lens, causal, scale)


def attention_if_eager(
    q: Any, k: Any, v: Any, causal: bool = False, scale: float | None = None,
    q_lens: Any | None = None, kv_lens: Any | None = None,
) -> Any | None:  # fmt: skip
    """:func:`attention` for a call :func:`~greta_core.ops._calls.eager_raw` allows (the
    torch.ops front's hot path), else None: the caller then takes its torch op."""
    if q_lens is not None or kv_lens is not None:
        check_length_values(q_lens, kv_lens)
    done = _fwd_call.if_eager(q, k, v, q_lens, kv_lens, causal, scale)
    return None if done is None else done[0]


def attention(
    q: Any, k: Any, v: Any, causal: bool = False, scale: float | None = None,
    q_lens: Any | None = None, kv_lens: Any | None = None,
) -> Any:  # fmt: skip
    """softmax(q k^T * scale) v over [B, H, S, D] tensors (GQA: Hq a multiple of Hkv).

    ``q_lens``/``kv_lens`` (int32 [B]) give per-batch valid lengths: query row i < q_len
    sits at position kv_len - q_len + i and sees keys j < kv_len (j <= position if
    causal); rows i >= q_len come back as zeros. NaN in, NaN out (like SDPA).

    Raises GretaInputError for a wrong shape, dtype, device, layout or length.
    """
    return attention_with_lse(q, k, v, causal, scale, q_lens, kv_lens)[0]
