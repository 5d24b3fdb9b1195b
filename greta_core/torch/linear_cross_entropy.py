"""greta::linear_cross_entropy (user op, autograd): cross-entropy of hidden @ weight.T
without the logits. Its front (this module) picks what runs and calls the triton_op
greta::linear_cross_entropy_fwd -> (loss, dhidden, dweight), derived with its autograd from
the declaration in ops/linear_cross_entropy.py: with ``with_grad`` (grad mode on, an input
needing it, reduction mean or sum) the gradients come out of the forward's chunks and the
backward only scales them; otherwise the backward is the declared triton_op
greta::linear_cross_entropy_bwd, which redoes the chunks with per-row gradients
(reduction="none").

Inside ``consume_inputs()`` (apply_greta's causal-LM loss) the Triton path writes dhidden
over ``hidden`` in the forward (see :func:`_consumes_hidden`): the forward's peak then holds
one [tokens, hidden] tensor less.

Where the arch's config table says another implementation is faster for the call's shape
(``linear_cross_entropy_dispatch``, decided by :func:`greta_core.ops.linear_cross_entropy.choose`)
the op runs torch's own instead, ``torch.nn.functional.linear_cross_entropy`` (torch >= 2.13)
or F.linear + F.cross_entropy before it; ``observe`` records which one ran."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any

import torch

from greta_core.arch import arch_of
from greta_core.observe import record
from greta_core.ops import linear_cross_entropy as raw
from greta_core.torch._common import consuming
from greta_core.torch._declared import register
from greta_core.torch._norms_common import run_triton_on_cpu, takes_reference

# greta::linear_cross_entropy_fwd and greta::linear_cross_entropy_bwd: derived from their
# declarations (ops/linear_cross_entropy.py). mutates_args=() although dh_into_hidden=True
# writes `hidden`: an op with declared mutations cannot have register_autograd.
# _linear_cross_entropy passes True only on concrete tensors (never while tracing, where
# functionalization would trust the schema).
linear_cross_entropy_bwd = register(raw.LINEAR_CROSS_ENTROPY_BWD)
linear_cross_entropy_fwd = register(raw.LINEAR_CROSS_ENTROPY_FWD)


def _is_concrete(t: torch.Tensor) -> bool:
    """A plain tensor with data, outside any tracing: its value may steer Python code."""
    return (
        type(t) is torch.Tensor
        and not torch.compiler.is_compiling()
        and not torch._C._len_torch_dispatch_stack()
    )


def _takes_triton(hidden: torch.Tensor, weight: torch.Tensor) -> bool:
    """The forward's body runs the Triton kernel (a GPU in a kernel dtype, or the CPU
    interpreter when asked for), not the torch reference."""
    if hidden.device.type == "cpu":
        return run_triton_on_cpu(hidden, weight)
    return not takes_reference(hidden)


def _consumes_hidden(hidden: torch.Tensor, weight: torch.Tensor, with_grad: bool) -> bool:
    """Whether this call writes dhidden over `hidden` (dh_into_hidden). Only inside
    consume_inputs() (the caller owns `hidden`); when the forward computes the gradients;
    on concrete tensors (a traced graph would bake the flag in as a constant); on the
    Triton path (where dhidden is a fresh [tokens, hidden] tensor otherwise); for a `hidden`
    contiguous as given (else the raw API's .contiguous() copy is fresh anyway: nothing to
    save) and not a leaf that requires grad (a parameter's data, never an intermediate)."""
    return (
        with_grad
        and consuming()
        and _is_concrete(hidden)
        and hidden.is_contiguous()
        and not (hidden.is_leaf and hidden.requires_grad)
        and _takes_triton(hidden, weight)
    )


_lib = torch.library.Library("greta", "FRAGMENT")
_lib.define(
    "linear_cross_entropy(Tensor hidden, Tensor weight, Tensor target, int ignore_index=-100, "
    "str reduction='mean') -> Tensor"
)


@functools.cache
def core_api() -> str:
    """What this torch offers for the dispatch (ops.linear_cross_entropy.CORE_APIS)."""
    fn = getattr(torch.nn.functional, "linear_cross_entropy", None)
    if fn is None:
        return "none"
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature: call it plainly
        return "plain"
    return "options" if "options" in params and core_options_class() is not None else "plain"


def core_options_class() -> Any:
    """torch's LinearCrossEntropyOptions (torch.nn from 2.14, torch.nn.functional too)."""
    for module in (torch.nn, torch.nn.functional):
        cls = getattr(module, "LinearCrossEntropyOptions", None)
        if cls is not None:
            return cls
    return None


def core_options(arch: str, n_rows: int, vocab: int, hidden: int) -> Any:
    """LinearCrossEntropyOptions from the table's ``core_options`` (fields this torch's
    options class lacks are left out: the class changed between torch releases)."""
    cls = core_options_class()
    wanted = raw.dispatch_config(arch, n_rows, vocab, hidden).get("core_options", {})
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    return cls(**{k: v for k, v in wanted.items() if k in fields})


def _dispatched(hidden: torch.Tensor, weight: torch.Tensor, reduction: str) -> tuple[str, str]:
    """(what runs, arch). Only a call that GRETA's kernel would run is dispatched: the CPU
    and float64 references stay as they are, and a malformed call reaches the kernel's
    validation (its one-line error)."""
    if hidden.dim() != 2 or weight.dim() != 2 or not _takes_triton(hidden, weight):
        return "greta", ""
    arch = arch_of(hidden)
    n_rows, vocab, size = hidden.shape[0], weight.shape[0], hidden.shape[1]
    return raw.choose(arch, n_rows, vocab, size, reduction, core_api()), arch


def _torch_loss(
    impl: str, arch: str, hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
    ignore_index: int, reduction: str,
) -> torch.Tensor:  # fmt: skip
    """The loss by torch's own code; the inputs are checked as GRETA's kernel checks them
    (same one-line errors whichever implementation the table picks). The unchunked paths
    take per-row losses and sum them in float32, as the kernel does: torch's own sum or mean
    of bf16 losses rounds the total to bf16 (8 bits). "mean" is that sum times
    1 / max(1, non-ignored targets), the kernel's rule: a batch whose targets are all ignored
    gives 0 (torch's own mean gives NaN), whichever implementation ran."""
    raw.validate(hidden, weight, target, reduction)
    target, refused = raw.screen_targets(target, weight.shape[0], ignore_index)
    if not torch.compiler.is_compiling():
        record(raw.OP, impl, arch)
    if impl == raw.CORE_CHUNKED:  # its chunked path takes "sum" or "mean" only
        options = core_options(arch, hidden.shape[0], weight.shape[0], hidden.shape[1])
        loss = torch.nn.functional.linear_cross_entropy(
            hidden, weight, target, reduction="sum", ignore_index=ignore_index, options=options
        ).to(torch.float32)
        loss = raw.poison(loss, refused)
    else:
        if impl == raw.LINEAR_CE:
            rows = torch.nn.functional.cross_entropy(
                torch.nn.functional.linear(hidden, weight), target,
                ignore_index=ignore_index, reduction="none",
            )  # fmt: skip
        else:
            rows = torch.nn.functional.linear_cross_entropy(
                hidden, weight, target, reduction="none", ignore_index=ignore_index
            )
        rows = raw.poison(rows.to(torch.float32), refused)
        if reduction == "none":
            return rows
        loss = rows.sum()
    if reduction == "mean":
        loss = loss * raw.mean_scale(target, ignore_index)[0]
    return loss


def _linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> torch.Tensor:
    impl, arch = _dispatched(hidden, weight, reduction)
    if impl != "greta":
        return _torch_loss(impl, arch, hidden, weight, target, ignore_index, reduction)
    with_grad = (
        torch.is_grad_enabled()
        and (hidden.requires_grad or weight.requires_grad)
        and reduction != "none"
    )
    dh_into_hidden = _consumes_hidden(hidden, weight, with_grad)
    return torch.ops.greta.linear_cross_entropy_fwd(
        hidden, weight, target, ignore_index, reduction, with_grad, dh_into_hidden
    )[0]


# CompositeImplicitAutograd: decomposes into linear_cross_entropy_fwd (autograd, compile,
# fake tensors all follow).
_lib.impl("linear_cross_entropy", _linear_cross_entropy, "CompositeImplicitAutograd")
