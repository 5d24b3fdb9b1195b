"""Attention backward: (dq, dk, dv) from (do, q, k, v, o, lse) with the Triton kernels.

No per-batch lengths (q_lens/kv_lens): those calls keep the reference backward.
"""

from __future__ import annotations

from typing import Any

from greta_core import configs
from greta_core.arch import backend
from greta_core.kernels.attention_bwd import attention_bwd_dkdv_kernel, attention_bwd_dq_kernel
from greta_core.ops import _interp_compat
from greta_core.ops._plan import Buffer, In, Launch, Out, Plan, Wrap, memo, run
from greta_core.ops._plan import _identity as _no_wrap
from greta_core.ops._validate import GretaInputError, check_tensor
from greta_core.ops.attention import default_scale, validate

OP = "attention_bwd"
Config = dict[str, int]


def kernel_configs(arch: str, head_dim: int) -> tuple[Config, Config]:
    """(dkdv config, dq config) from the tables: block sizes + num_warps/num_stages."""
    features = {"D": head_dim, "backend": backend(arch)}
    return (
        configs.lookup("attention_bwd_dkdv", arch, features),
        configs.lookup("attention_bwd_dq", arch, features),
    )


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


@memo
def plan(
    q_shape: tuple[int, ...], kv_heads_seq: tuple[int, int],
    strides: tuple[tuple[int, ...], ...], causal: bool, scale: float | None, arch: str,
    overrides: tuple[Config, Config] | None = None,
) -> Plan:  # fmt: skip
    """Inputs (q, k, v, do, lse, delta = sum(o * do, -1) fp32); `strides`: the [:3] strides of
    q, k, v, do. Buffers (fp32; zeroed only when nothing launches): dq [B, Hq, Sq, D],
    dk and dv per *query* head [B, Hq, Skv, D] (the caller sums each GQA group). `overrides`: (dkdv, dq) configs
    instead of the tables' (tuning; unhashable, so never memoized)."""
    batch, heads_q, seq_q, dim = q_shape
    heads_kv, seq_kv = kv_heads_seq
    dkdv_cfg, dq_cfg = overrides or kernel_configs(arch, dim)
    args = (
        In(0), In(1), In(2), In(3), In(4), In(5),
        default_scale(dim) if scale is None else float(scale),
        seq_q, seq_kv, heads_q, heads_q // heads_kv, *(s for st in strides for s in st),
    )  # fmt: skip
    common = {"HEAD_DIM": dim, "CAUSAL": bool(causal), "UPCAST": arch == "cpu"}
    (dkdv_blocks, dkdv_opts), (dq_blocks, dq_opts) = _split(dkdv_cfg, arch), _split(dq_cfg, arch)
    dkdv = Launch(
        attention_bwd_dkdv_kernel,
        ((seq_kv + dkdv_blocks["BLOCK_N"] - 1) // dkdv_blocks["BLOCK_N"], batch * heads_q),
        (*args, Out(1), Out(2)), {**common, **dkdv_blocks}, dkdv_opts,
    )  # fmt: skip
    dq = Launch(
        attention_bwd_dq_kernel,
        ((seq_q + dq_blocks["BLOCK_M"] - 1) // dq_blocks["BLOCK_M"], batch * heads_q),
        (*args, Out(0)), {**common, **dq_blocks}, dq_opts,
    )  # fmt: skip
    # The kernels write every element; only a plan with no launch needs the zeros (a
    # memset of three fp32 gradient-sized buffers per backward otherwise).
    empty = batch * heads_q * seq_q * seq_kv == 0
    per_head = Buffer((batch, heads_q, seq_kv, dim), "float32", zeroed=empty)
    buffers = (Buffer(q_shape, "float32", zeroed=empty), per_head, per_head)
    return Plan(OP, arch, buffers, () if empty else (dkdv, dq), (0, 1, 2))


def _plan_for(
    do: Any, q: Any, k: Any, v: Any, causal: bool, scale: float | None, arch: str,
    overrides: tuple[Config, Config] | None = None,
) -> Plan:  # fmt: skip
    if arch == "cpu":
        _interp_compat.apply()
    strides = tuple(tuple(t.stride()[:3]) for t in (q, k, v, do))
    return plan(
        tuple(q.shape), (k.shape[1], k.shape[2]), strides, bool(causal),
        None if scale is None else float(scale), arch, overrides,
    )  # fmt: skip


def launch(
    do: Any, q: Any, k: Any, v: Any, lse: Any, delta: Any, causal: bool, scale: float | None,
    dq: Any, dk_heads: Any, dv_heads: Any, arch: str, wrap: Wrap = _no_wrap,
    configs: tuple[Config, Config] | None = None,
) -> None:  # fmt: skip
    """Run into preallocated fp32 dq [B, Hq, Sq, D] and dk_heads/dv_heads [B, Hq, Skv, D]
    (zero them first). `configs`: (dkdv, dq) overrides of the tables (tuning)."""
    p = _plan_for(do, q, k, v, causal, scale, arch, configs)
    p = Plan(
        p.op, p.arch, tuple(Buffer(b.shape, b.dtype) for b in p.buffers), p.launches, p.results
    )
    run(p, (q, k, v, do, lse, delta), out=(dq, dk_heads, dv_heads), wrap=wrap)


def fold_heads(t: Any, heads_kv: int) -> Any:
    """[B, Hq, S, D] -> [B, Hkv, S, D]: sum the query heads sharing a KV head (torch or jnp)."""
    batch, heads_q, seq, dim = t.shape
    return t.reshape(batch, heads_kv, heads_q // heads_kv, seq, dim).sum(2)


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
    arch = validate_bwd(do, q, k, v, o, lse)
    delta = (o.float() * do.float()).sum(-1).contiguous()
    p = _plan_for(do, q, k, v, causal, scale, arch)
    dq, dk, dv = run(p, (q, k, v, do, lse, delta), wrap=wrap)
    heads_kv = k.shape[1]
    return (
        dq.to(q.dtype),
        fold_heads(dk, heads_kv).to(k.dtype),
        fold_heads(dv, heads_kv).to(v.dtype),
    )
