"""Pick and run an implementation: the forced one, else the first available."""

from __future__ import annotations

from typing import Any

from greta_core.compute._probes import CallInfo
from greta_core.compute.forcing import forced
from greta_core.compute.registry import KINDS, Impl, get
from greta_core.errors import GretaUnavailableError
from greta_core.observe import record

_cache: dict[tuple[str, CallInfo, str | None], str] = {}


def clear_cache() -> None:
    """Forget probe results (e.g. after registering new torch.ops.greta ops)."""
    _cache.clear()


def candidates(op: str, info: CallInfo) -> list[tuple[Impl, str | None]]:
    """Every implementation of `op` with its probe result for this call, in order."""
    return [(impl, impl.probe(info)) for impl in get(op).impls]


def _choose(op: str, info: CallInfo) -> str:
    spec = get(op)
    choice = forced(op)
    key = (op, info, choice[0] if choice else None)
    hit = _cache.get(key)
    if hit is not None:
        return hit
    if choice:
        wanted, source = choice
        pool = (
            [i for i in spec.impls if i.kind == wanted]
            if wanted in KINDS and wanted not in spec.names()
            else [spec.impl(wanted)]
        )
        reasons = []
        for impl in pool:
            why = impl.probe(info)
            if why is None:
                _cache[key] = impl.name
                return impl.name
            reasons.append(f"{impl.name}: {why}" if len(pool) > 1 else why)
        raise GretaUnavailableError(
            op, wanted, f"{'; '.join(reasons)} [forced by {source}; no other is substituted]"
        )
    reasons = []
    for impl in spec.impls:
        why = impl.probe(info)
        if why is None:
            _cache[key] = impl.name
            return impl.name
        reasons.append(f"{impl.name}: {why}")
    raise GretaUnavailableError(op, "any", "; ".join(reasons))


def _compiling() -> bool:
    try:
        import torch

        return bool(torch.compiler.is_compiling())
    except (ImportError, AttributeError):
        return False


def _choose_constant(op: str, fields: tuple[Any, ...]) -> str:
    # A plain tuple crosses the tracer's constant boundary intact; a NamedTuple may not.
    return _choose(op, CallInfo(*fields))


# torch.compile: evaluate the choice once at trace time and bake it in as a constant (the
# probes call C++ helpers the tracer cannot follow). This is what
# torch._dynamo.assume_constant_result sets; set directly so importing stays torch-free.
_choose_constant._dynamo_marked_constant = True  # type: ignore[attr-defined]


def select(op: str, info: CallInfo) -> Impl:
    if _compiling():
        return get(op).impl(_choose_constant(op, tuple(info)))
    return get(op).impl(_choose(op, info))


def run(op: str, info: CallInfo, *args: Any, **kwargs: Any) -> Any:
    impl = select(op, info)
    if not _compiling():
        record(f"compute.{op}", impl.name, info.device)
    return impl.fn(*args, **kwargs)
