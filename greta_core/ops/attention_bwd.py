"""Attention backward: (dq, dk, dv) from (do, q, k, v, o, lse) with the Triton kernels: the
one launch recipe (:func:`plan`), declared as greta::attention_bwd (:data:`ATTENTION_BWD`),
which the raw, torch and JAX bindings all run.

No per-batch lengths (q_lens/kv_lens): those calls keep the reference backward.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from greta_core import configs, reference
from greta_core.kernels.attention_bwd import (
    Config,
    attention_bwd_delta_kernel,
    attention_bwd_dkdv_kernel,
    attention_bwd_dq_kernel,
    delta_config,
    kernel_configs,
)
from greta_core.ops import _interp_compat
from greta_core.ops._plan import Buffer, In, Launch, Out, Plan, Wrap, dtype_name, memo, run
from greta_core.ops._plan import _identity as _no_wrap
from greta_core.ops._validate import GretaInputError, check_tensor
from greta_core.ops.attention import AOT_HEADS, AOT_SEQ, HEAD_DIMS, default_scale, validate
from greta_core.ops.declare import Meta, OpDecl, declare

OP = "attention_bwd"


def validate_bwd(do: Any, q: Any, k: Any, v: Any, o: Any, lse: Any) -> str:
    """Check the inputs; returns the arch to launch on. Raises GretaInputError."""
    import torch

    arch = validate(q, k, v)
    for name, t in (("do", do), ("o", o)):
        check_tensor(OP, name, t, dtypes=(q.dtype,), ndim=4)
        if tuple(t.shape) != tuple(q.shape) or t.stride(3) != 1:
            raise GretaInputError(
                f"{OP}: argument '{name}' must be shaped like q {tuple(q.shape)} with a "
                f"contiguous last dim (got {tuple(t.shape)})"
            )
    check_tensor(OP, "lse", lse, dtypes=(torch.float32,), ndim=3, contiguous=True)
    if tuple(lse.shape) != tuple(q.shape[:3]):
        raise GretaInputError(
            f"{OP}: argument 'lse' has shape {tuple(lse.shape)}; expected {tuple(q.shape[:3])}"
        )
    return arch


def _split(config: Config, arch: str) -> tuple[Config, Config]:
    return configs.meta_params(config), configs.launch_options(config, arch)


def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


@memo
def plan(
    q_shape: tuple[int, ...], kv_heads_seq: tuple[int, int],
    strides: tuple[tuple[int, ...], ...], dtype: str, causal: bool, scale: float | None,
    arch: str, overrides: tuple[Config, Config] | None = None,
) -> Plan:  # fmt: skip
    """Inputs (q, k, v, do, lse, o); `strides`: the [:3] strides of q, k, v, do, o; `dtype`:
    q's dtype name.

    Launches: delta = rowsum(o * do) (fp32 scratch [B, Hq, Sq]), then the dkdv kernel (one
    program per key block and KV head, summing its GQA group) and the dq kernel. Results,
    contiguous, in `dtype` (each rounded once from the kernels' fp32 accumulators): dq
    [B, Hq, Sq, D], dk and dv [B, Hkv, Skv, D]. `overrides`: (dkdv, dq) configs instead of
    the tables' (tuning; unhashable, so never memoized)."""
    batch, heads_q, seq_q, dim = q_shape
    heads_kv, seq_kv = kv_heads_seq
    dkdv_cfg, dq_cfg = overrides or kernel_configs(arch, dim)
    upcast = arch == "cpu"
    q_st, k_st, v_st, do_st, o_st = strides
    delta_blocks, delta_opts = _split(delta_config(arch, dim), arch)
    delta = Launch(
        attention_bwd_delta_kernel,
        (_cdiv(seq_q, delta_blocks["BLOCK_M"]), batch * heads_q),
        (In(5), In(3), seq_q, heads_q, *o_st, *do_st, Out(3)),
        {"HEAD_DIM": dim, "UPCAST": upcast, **delta_blocks}, delta_opts,
    )  # fmt: skip
    args = (
        In(0), In(1), In(2), In(3), In(4), Out(3),
        default_scale(dim) if scale is None else float(scale),
        seq_q, seq_kv, heads_q, heads_q // heads_kv, *q_st, *k_st, *v_st, *do_st,
    )  # fmt: skip
    common = {"HEAD_DIM": dim, "CAUSAL": bool(causal), "UPCAST": upcast}
    (dkdv_blocks, dkdv_opts), (dq_blocks, dq_opts) = _split(dkdv_cfg, arch), _split(dq_cfg, arch)
    dkdv = Launch(
        attention_bwd_dkdv_kernel,
        (_cdiv(seq_kv, dkdv_blocks["BLOCK_N"]), batch * heads_kv),
        (*args, Out(1), Out(2)), {**common, **dkdv_blocks}, dkdv_opts,
    )  # fmt: skip
    dq = Launch(
        attention_bwd_dq_kernel,
        (_cdiv(seq_q, dq_blocks["BLOCK_M"]), batch * heads_q),
        (*args, Out(0)), {**common, **dq_blocks}, dq_opts,
    )  # fmt: skip
    # The kernels write every element; only a plan with no launch needs the zeros (a
    # memset of three gradient-sized buffers per backward otherwise).
    empty = batch * heads_q * seq_q * seq_kv == 0
    kv_grad = Buffer((batch, heads_kv, seq_kv, dim), dtype, zeroed=empty)
    buffers = (
        Buffer(q_shape, dtype, zeroed=empty), kv_grad, kv_grad,
        Buffer((batch, heads_q, seq_q), "float32"),
    )  # fmt: skip
    return Plan(OP, arch, buffers, () if empty else (delta, dkdv, dq), (0, 1, 2))


def _plan_for(
    do: Any, q: Any, k: Any, v: Any, o: Any, causal: bool, scale: float | None, arch: str,
    overrides: tuple[Config, Config] | None = None,
) -> Plan:  # fmt: skip
    if arch == "cpu":
        _interp_compat.apply()
    strides = tuple(tuple(t.stride()[:3]) for t in (q, k, v, do, o))
    return plan(
        tuple(q.shape), (k.shape[1], k.shape[2]), strides, dtype_name(q.dtype), bool(causal),
        None if scale is None else float(scale), arch, overrides,
    )  # fmt: skip


def result_shapes(
    q_shape: tuple[int, ...],
    heads_kv: int,
    seq_kv: int,
    arch: str,
    overrides: tuple[Config, Config] | None = None,
) -> tuple[tuple[int, ...], ...]:
    """Shapes of (dq, dk, dv) that :func:`launch` fills for this call (see :func:`plan`):
    q's shape, then [B, Hkv, Skv, D] twice (k's and v's)."""
    no_strides = ((0, 0, 0),) * 5  # shapes depend neither on them nor on the dtype
    p = plan(
        tuple(q_shape), (heads_kv, seq_kv), no_strides, "bfloat16", False, None, arch, overrides
    )
    return tuple(tuple(p.buffers[i].shape) for i in p.results)


def launch(
    do: Any, q: Any, k: Any, v: Any, o: Any, lse: Any, causal: bool, scale: float | None,
    dq: Any, dk: Any, dv: Any, arch: str, wrap: Wrap = _no_wrap,
    configs: tuple[Config, Config] | None = None,
) -> None:  # fmt: skip
    """Run into preallocated contiguous dq, dk, dv in q's dtype, shaped like q, k and v
    (:func:`result_shapes`); dk/dv are already summed over each GQA group. Nothing to zero
    first: the kernels write every element, and a plan that launches nothing zeroes them.
    `configs`: (dkdv, dq) overrides of the tables (tuning)."""
    p = _plan_for(do, q, k, v, o, causal, scale, arch, configs)
    run(p, (q, k, v, do, lse, o), out=(dq, dk, dv), wrap=wrap)


# The plan's inputs are (q, k, v, do, lse, o); the declaration's (do, q, k, v, o, lse):
# for each of the plan's, its position in the declaration's.
_DECLARED_AT = (1, 2, 3, 0, 5, 4)


def _declared_plan(
    arch: str, do: Meta, q: Meta, k: Meta, v: Meta, o: Meta, lse: Meta, causal: bool,
    scale: float | None,
) -> Plan:  # fmt: skip
    if arch == "cpu":
        _interp_compat.apply()
    strides = tuple(t.strides[:3] for t in (q, k, v, do, o))
    p = plan(q.shape, (k.shape[1], k.shape[2]), strides, q.dtype, bool(causal), scale, arch)
    launches = tuple(
        replace(launch, args=tuple(
            In(_DECLARED_AT[a.index]) if type(a) is In else a for a in launch.args
        ))
        for launch in p.launches
    )  # fmt: skip
    return Plan(p.op, p.arch, p.buffers, launches, p.results)


def _validate(
    do: Any, q: Any, k: Any, v: Any, o: Any, lse: Any, causal: bool = False,
    scale: float | None = None, reference: bool = False,
) -> str:  # fmt: skip
    if reference:
        from greta_core.ops.attention import check_shapes

        check_shapes(q, k, v)
        return "cpu"
    return validate_bwd(do, q, k, v, o, lse)


# Training in bf16 (fp16 training on these GPUs is rare: it needs loss scaling), causal (a
# decoder's), GQA (the forward's first AOT_HEADS): each kernel here costs about 2 CPU-s to
# build, and the gfx942 wheel must build in under 3 minutes on 2 cores. The kernels leave
# the key length and head counts unspecialised on 16-divisibility but not the query length
# (kernels/attention_bwd.py UNALIGNED_INTS), so one length of each kind serves all: these
# cases serve every length and GQA head count. The rest (MHA, fp16, fp32, not causal)
# compiles on first use.
AOT_DTYPES: tuple[str, ...] = ("bfloat16",)
AOT_SEQS: tuple[int, ...] = (AOT_SEQ, 1037)  # 16-divisible, and not


def _aot(arch: str) -> list[tuple[Any, ...]]:
    """The backward of each GQA training forward case of ops/attention.py, at each AOT_SEQS."""
    heads_q, heads_kv = AOT_HEADS[0]
    cases: list[tuple[Any, ...]] = []
    for dtype in AOT_DTYPES:
        for dim in HEAD_DIMS:
            for seq in AOT_SEQS:
                q = Meta.contiguous((1, heads_q, seq, dim), dtype)
                kv = Meta.contiguous((1, heads_kv, seq, dim), dtype)
                lse = Meta.contiguous((1, heads_q, seq), "float32")
                cases.append((q, q, kv, kv, q, lse, True, None))
    return cases


ATTENTION_BWD = declare(OpDecl(
    name=OP,
    schema=(
        "Tensor do, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, bool causal=False, "
        "float? scale=None -> (Tensor, Tensor, Tensor)"
    ),
    describe="the attention backward: (dq, dk, dv) from the forward's output and logsumexp",
    validate=_validate,
    plan=_declared_plan,
    reference=lambda do, q, k, v, o, lse, causal=False, scale=None: reference.attention_bwd(
        do, q, k, v, causal, scale
    ),
    front=False,
    # fp32: the logsumexp (q's dtype is fp16/bf16, which validation asks for).
    kernel_dtypes=("float16", "bfloat16", "float32"),
    uses_matrix_units=("attention_bwd_dkdv_kernel", "attention_bwd_dq_kernel"),  # not delta
    aot_cases=_aot,
    aot_case_ints=True,
))  # fmt: skip


def attention_bwd(
    do: Any, q: Any, k: Any, v: Any, o: Any, lse: Any, causal: bool = False,
    scale: float | None = None, wrap: Wrap = _no_wrap,
) -> tuple[Any, Any, Any]:  # fmt: skip
    """Gradients of ``attention(q, k, v, causal, scale)`` given its output ``o``, its
    logsumexp ``lse`` (``attention_with_lse``) and ``do`` = dL/do: (dq, dk, dv) in q's dtype;
    dk/dv summed over each group of query heads sharing a KV head. `wrap` is
    `torch.library.wrap_triton` inside a triton_op.

    Raises GretaInputError for a wrong shape, dtype, device or layout.
    """
    return ATTENTION_BWD.raw(do, q, k, v, o, lse, causal, scale, wrap=wrap)
