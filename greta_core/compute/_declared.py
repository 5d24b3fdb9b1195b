"""The GretaCompute entry of a declared op (``greta_core.ops.declare``): the GRETA kernel
(the ready launch for plain eager GPU tensors, else ``torch.ops.greta.<name>``), then the
declared reference in plain torch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from greta_core.compute import _probes as p
from greta_core.compute.registry import Impl, Op, add, define
from greta_core.ops.declare import OpDecl


def entry(
    op: OpDecl, reference_label: str = "plain torch math", *, greta_label: str | None = None,
    vendor: Impl | None = None,
) -> Op:  # fmt: skip
    """Define GretaCompute's `op.name` with its GRETA implementation, `vendor` (a vendor
    library or the framework's own kernel) where there is one, and the reference."""
    n = op.n_tensors

    def greta(*args: Any) -> Any:
        if p.eager_raw(*args[:n]):
            return op.raw(*args)
        import torch

        return p.unwrap(getattr(torch.ops.greta, op.name)(*args))

    def reference(*args: Any) -> Any:
        return op.reference(*op.bind(args, {}))

    def info(*args: Any) -> p.CallInfo:
        return p.info_of(*args[:n])

    kernel = f"the GRETA {op.name} kernel"
    compute = define(op.name, op.describe, info)
    add(compute, Impl(
        "greta", "greta", greta,
        lambda i: p.first_reason(p.greta_op(op.name), p.dtype_in(i, op.kernel_dtypes, kernel)),
        {"any": greta_label or f"GRETA Triton {op.name}"},
    ))  # fmt: skip
    if vendor is not None:
        add(compute, vendor)
    add(compute, Impl(
        "reference", "reference", reference,
        lambda i: p.dtype_in(i, p.FLOATS, "the reference"), {"any": reference_label},
    ))  # fmt: skip
    return compute


def caller(compute: Op) -> Callable[..., Any]:
    """``greta_core.compute.<name>``'s function: one call through dispatch."""
    from greta_core.compute.dispatch import run

    def call(*args: Any) -> Any:
        return run(compute.name, compute.info(*args), *args)

    call.__name__ = compute.name
    return call
