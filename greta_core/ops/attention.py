"""Attention (softmax(q k^T * scale) v over [B, H, S, D], GQA, optional per-batch
lengths): the declaration of greta::attention, whose forward greta::attention_fwd also
returns the fp32 logsumexp the backward reads (``attention_bwd.py`` declares the
backward's kernel op). The backward is the Triton FlashAttention-2 backward for fp16/bf16
calls without lengths; with lengths it is the softmax-attention gradient of the reference
(it holds the [B, H, Sq, Skv] probabilities)."""

from __future__ import annotations

import math
import sys
from typing import Any

from greta_core import configs
from greta_core import reference as ref
from greta_core.kernels.attention import attention_fwd_kernel, features
from greta_core.observe import record
from greta_core.ops import _interp_compat
from greta_core.ops._plan import Buffer, In, Launch, Out, Plan, Wrap, dtype_name, memo, run
from greta_core.ops._plan import _identity as _no_wrap
from greta_core.ops._rows import check_array_float
from greta_core.ops._validate import GretaInputError, check_same_device, check_tensor, launch_arch
from greta_core.ops.declare import DECLARED, Backward, Meta, OpDecl, declare

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


def _on_host(lens: Any) -> bool:
    """A plain CPU torch tensor, or a JAX array (the JAX binding asks for concrete ones
    only): values to read without a device sync. A traced or fake tensor has none."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(lens, torch.Tensor):
        return type(lens) is torch.Tensor and lens.device.type == "cpu"
    return True


def check_length_values(q_lens: Any | None, kv_lens: Any | None) -> None:
    """Negative lengths of values on the host (see `_on_host`). Value checks, not
    signature ones: the raw API runs this on every call, cached or not."""
    for name, lens in (("q_lens", q_lens), ("kv_lens", kv_lens)):
        if lens is not None and _on_host(lens) and lens.shape[0] and int(lens.min()) < 0:
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


def _lens_args(batch: int, seq_q: int, seq_kv: int, lens: str, slots: bool) -> tuple[tuple, tuple]:
    """(q_lens, kv_lens) arguments and the extra buffers they need. `lens`: which of the two
    the call gave ("", "q", "kv", "q+kv"); a missing one is the full length of its axis.
    `slots`: the inputs are (q, k, v, q_lens, kv_lens), None for a missing one (the
    declaration's); else the lengths given follow v."""
    if not lens:
        return (In(0), In(0)), ()  # never read: HAS_LENS is False
    if lens == "q+kv":
        return (In(3), In(4)), ()
    full = Buffer((batch,), "int32", fill=seq_kv if lens == "q" else seq_q)
    return ((In(3), Out(2)) if lens == "q" else (Out(2), In(4 if slots else 3))), (full,)


@memo
def plan_fwd(
    q_shape: tuple[int, ...], kv_heads_seq: tuple[int, int],
    strides: tuple[tuple[int, ...], ...], dtype: str, causal: bool, scale: float | None,
    lens: str, arch: str, slots: bool = False,
) -> Plan:  # fmt: skip
    """Inputs (q, k, v[, q_lens][, kv_lens]) (`slots`: see `_lens_args`); `strides`: the
    [:3] strides of q, k, v. Buffers: o [B, Hq, Sq, D] (q's dtype), lse [B, Hq, Sq] fp32
    (natural log)."""
    batch, heads_q, seq_q, dim = q_shape
    heads_kv, seq_kv = kv_heads_seq
    config = configs.lookup(OP, arch, features(dim, seq_q, seq_kv, causal))
    meta = configs.meta_params(config)
    lens_args, extra = _lens_args(batch, seq_q, seq_kv, lens, slots)
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


def _plan(
    arch: str, q: Meta, k: Meta, v: Meta, q_lens: Meta | None, kv_lens: Meta | None,
    causal: bool, scale: float | None, stats: bool,
) -> Plan:  # fmt: skip
    """The declaration's plan. The kernel always stores the logsumexp: `stats` or not,
    one plan (o, lse), which a call no backward follows drops."""
    if arch == "cpu":
        _interp_compat.apply()
    return plan_fwd(
        q.shape, (k.shape[1], k.shape[2]), (q.strides[:3], k.strides[:3], v.strides[:3]),
        q.dtype, bool(causal), scale, lens_key(q_lens, kv_lens), arch, True,
    )  # fmt: skip


def _validate(
    q: Any, k: Any, v: Any, q_lens: Any | None, kv_lens: Any | None, causal: bool = False,
    scale: float | None = None, reference: bool = False,
) -> str:  # fmt: skip
    if reference:
        check_shapes(q, k, v, q_lens, kv_lens)
        return "cpu"
    return validate(q, k, v, q_lens, kv_lens)


def check_arrays(
    q: Any, k: Any, v: Any, q_lens: Any | None, kv_lens: Any | None, causal: bool = False,
    scale: float | None = None,
) -> None:  # fmt: skip
    """JAX arrays: GretaInputError for shapes or dtypes the op does not take."""
    check_array_float(OP, "q", q)
    if q.ndim != 4 or k.ndim != 4 or v.shape != k.shape:
        raise GretaInputError(
            f"attention: arguments 'q' {q.shape}, 'k' {k.shape}, 'v' {v.shape} must be "
            "[B, H, S, D] with k and v of one shape"
        )
    if k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
        raise GretaInputError(f"attention: argument 'k' {k.shape} does not fit q {q.shape}")
    if q.shape[3] == 0:  # the default scale is 1/sqrt(D), as in the torch binding
        raise GretaInputError(
            f"attention: argument 'q' has shape {tuple(q.shape)}; its head dim must be >= 1"
        )
    if k.shape[1] == 0 or q.shape[1] % k.shape[1] != 0:
        raise GretaInputError(
            f"attention: argument 'k' has {k.shape[1]} heads; q's {q.shape[1]} must be a multiple"
        )
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise GretaInputError(f"attention: arguments 'k', 'v' must have q's dtype {q.dtype}")
    for name, lens in (("q_lens", q_lens), ("kv_lens", kv_lens)):
        if lens is not None and (lens.shape != (q.shape[0],) or str(lens.dtype) != "int32"):
            raise GretaInputError(
                f"attention: argument '{name}' must be int32 of shape ({q.shape[0]},)"
            )


def _reference(
    q: Any, k: Any, v: Any, q_lens: Any | None, kv_lens: Any | None, causal: bool,
    scale: float | None,
) -> tuple[Any, Any]:  # fmt: skip
    """(o in q's dtype, logsumexp fp32): the kernel's semantics in torch or jnp ops."""
    out, lse = ref.attention_with_lse(q, k, v, causal, scale, q_lens, kv_lens)
    xp = ref._xp(lse)
    return out, xp.astype(lse, xp.float32)


# --- the AOT cases: the calls apply_greta makes ----------------------------------------------
# A call's key holds each int's divisibility by 16 (a 1 is the constexpr 1), except the ints
# the kernels leave unspecialised on it (kernels/attention.py UNALIGNED_INTS: the lengths and
# head counts, whose 1 is still a constant); the strides are multiples of the head dim. So
# one case per kind of call serves every length and head count, and each case is compiled
# at its own ints (``aot_case_ints``; ``declare.aot_specs`` keys them as the JIT does). The
# cases are the calls transformers' attention hook makes (greta_core/transformers/
# attention.py: no lengths, Sq == Skv and causal, or a one-token decode step over any
# number of keys, not causal). The raw API's per-batch lengths (q_lens, kv_lens), which the
# hook never passes, compile on first use (8 kernels, about 2.7 CPU-s each on gfx942).

# (query heads, KV heads): GQA, whose group is an int (Llama-3, Mistral, Qwen2.5/3, and
# MQA), and MHA, whose group is the constexpr 1 (Llama-2-7B, Phi-3-mini).
AOT_HEADS: tuple[tuple[int, int], ...] = ((32, 8), (32, 32))
# The prefill (training) length, and the decode step's cache length: any length > 1 meets
# the same key. Prompts of 2-16 tokens take the table's short-query tiles and compile on
# first use, as does a one-token prompt (Sq == Skv == 1, both constants).
AOT_SEQ = 2048


def _aot_qkv(dtype: str, dim: int, heads: tuple[int, int], seq_q: int, seq_kv: int) -> tuple:
    heads_q, heads_kv = heads
    q = Meta.contiguous((1, heads_q, seq_q, dim), dtype)
    kv = Meta.contiguous((1, heads_kv, seq_kv, dim), dtype)
    return q, kv, kv


def _aot(arch: str) -> list[tuple[Any, ...]]:
    """Per dtype, head dim and AOT_HEADS: the prefill/training call (causal) and the decode
    step (one query, not causal)."""
    cases: list[tuple[Any, ...]] = []
    for dtype in KERNEL_DTYPE_NAMES:
        for dim in HEAD_DIMS:
            for heads in AOT_HEADS:
                prefill = _aot_qkv(dtype, dim, heads, AOT_SEQ, AOT_SEQ)
                cases.append((*prefill, None, None, True, None, False))
                decode = _aot_qkv(dtype, dim, heads, 1, AOT_SEQ)
                cases.append((*decode, None, None, False, None, False))
    return cases


def _binding_of(a: Any) -> str:
    return "torch" if type(a).__module__.partition(".")[0] == "torch" else "jnp"


def _grads(call: Any, grads: tuple[Any, ...], saved: Any) -> tuple[Any, ...]:
    (do,) = grads
    q, k, v = saved.q, saved.k, saved.v
    if saved.q_lens is None and saved.kv_lens is None and dtype_name(q.dtype) in KERNEL_DTYPE_NAMES:
        # The forward's output and logsumexp: no second forward. The backward's kernel op,
        # by name: ops/attention_bwd.py imports this module (validate, default_scale), and
        # every binding imports that one.
        dq, dk, dv = call(
            DECLARED["attention_bwd"], call.contiguous(do), q, k, v, saved.out0, saved.lse, saved.causal,
            saved.scale,
        )  # fmt: skip
    else:
        binding = _binding_of(q)
        record("attention_bwd", f"reference-{binding}", q.device.type if binding == "torch" else "")
        dq, dk, dv = ref.attention_bwd(
            do, q, k, v, saved.causal, saved.scale, saved.q_lens, saved.kv_lens
        )
    return dq, dk, dv, None, None, None, None


ATTENTION = declare(OpDecl(
    name=OP,
    schema=(
        "Tensor q, Tensor k, Tensor v, bool causal=False, float? scale=None, "
        "Tensor? q_lens=None, Tensor? kv_lens=None -> Tensor"
    ),
    describe="softmax(q k^T * scale) v, grouped-query heads, optional per-batch lengths",
    validate=_validate,
    plan=_plan,
    reference=_reference,
    backward=Backward(_grads, saves=("q", "k", "v", "q_lens", "kv_lens", "lse"),
                      saves_outputs=(0,)),
    check_arrays=check_arrays,
    check_values=lambda q, k, v, q_lens, kv_lens, *_: check_length_values(q_lens, kv_lens),
    kernel_takes=lambda q, k, v, *_: q.shape[3] in HEAD_DIMS,
    kernel_dtypes=KERNEL_DTYPE_NAMES,
    uses_matrix_units=True,
    stats=("lse",),
    aot_cases=_aot,
    aot_case_ints=True,
))  # fmt: skip

# The call cache the torch front's no-grad path takes (and tests reach).
_fwd_call = ATTENTION.call


# --- the raw API (torch tensors, no autograd) ----------------------------------------------


def attention_with_lse(
    q: Any, k: Any, v: Any, causal: bool = False, scale: float | None = None,
    q_lens: Any | None = None, kv_lens: Any | None = None, wrap: Wrap = _no_wrap,
) -> tuple[Any, Any]:  # fmt: skip
    """(o [B, Hq, Sq, D], logsumexp [B, Hq, Sq] fp32 in natural log).

    Raises GretaInputError for a wrong shape, dtype, device, layout or length.
    """
    if q_lens is not None or kv_lens is not None:
        check_length_values(q_lens, kv_lens)
    return ATTENTION.raw_fwd(q, k, v, causal, scale, q_lens, kv_lens, wrap=wrap)


def attention_if_eager(
    q: Any, k: Any, v: Any, causal: bool = False, scale: float | None = None,
    q_lens: Any | None = None, kv_lens: Any | None = None,
) -> Any | None:  # fmt: skip
    """:func:`attention` for a call :func:`~greta_core.ops._calls.eager_raw` allows (the
    torch.ops front's hot path), else None: the caller then takes its torch op."""
    if q_lens is not None or kv_lens is not None:
        check_length_values(q_lens, kv_lens)
    return ATTENTION.if_eager(
        q, k, v, q_lens, kv_lens, bool(causal), None if scale is None else float(scale)
    )


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
    if q_lens is not None or kv_lens is not None:
        check_length_values(q_lens, kv_lens)
    return ATTENTION.raw(q, k, v, causal, scale, q_lens, kv_lens)
