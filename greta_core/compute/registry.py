"""The table of operations and their ordered implementations (no torch import here).

Each operation lists its implementations best first: the GRETA Triton kernel, vendor
libraries reached through the framework (cuBLAS/hipBLASLt, cuDNN/MIOpen, FlashAttention/
AOTriton/CK), then a plain-torch reference. Every implementation carries a probe that says,
for one call's metadata, why it cannot run (or None when it can). Dispatch (dispatch.py)
runs the first one whose probe passes, unless the user forced one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from greta_core.errors import GretaConfigError, UnknownOpError

KINDS: tuple[str, ...] = ("greta", "vendor", "reference")

# A probe gets the call's metadata and returns None (available) or the reason it is not.
Probe = Callable[[Any], "str | None"]


@dataclass(frozen=True)
class Impl:
    """One way to run an op. `library` maps platform ("cuda"/"rocm"/"cpu") to a label."""

    name: str
    kind: str
    fn: Callable[..., Any]
    probe: Probe
    library: dict[str, str] = field(default_factory=dict)

    def library_on(self, platform: str) -> str:
        lib = self.library
        return lib.get(platform) or lib.get("any") or lib.get("cuda") or self.name


@dataclass
class Op:
    name: str
    describe: str
    # Builds the hashable call metadata the probes read from the op's arguments.
    info: Callable[..., Any]
    impls: list[Impl] = field(default_factory=list)

    def impl(self, name: str) -> Impl:
        for impl in self.impls:
            if impl.name == name:
                return impl
        raise UnknownOpError(name)

    def names(self) -> list[str]:
        return [impl.name for impl in self.impls]


REGISTRY: dict[str, Op] = {}

# Display order (reports, docs); registration order follows module import order instead.
ORDER: tuple[str, ...] = (
    "matmul", "attention", "rms_norm", "layer_norm", "softmax", "rope", "kv_cache_append",
    "conv2d",
)  # fmt: skip


def define(name: str, describe: str, info: Callable[..., Any]) -> Op:
    op = REGISTRY.setdefault(name, Op(name, describe, info))
    return op


def add(op: Op, impl: Impl) -> None:
    if impl.kind not in KINDS:
        raise GretaConfigError(f"{op.name}: unknown implementation kind {impl.kind!r}")
    if impl.name in op.names():
        raise GretaConfigError(f"{op.name}: implementation {impl.name!r} defined twice")
    op.impls.append(impl)


def get(op: str) -> Op:
    try:
        return REGISTRY[op]
    except KeyError:
        known = ", ".join(sorted(REGISTRY)) or "none"
        raise GretaConfigError(f"GretaCompute: unknown operation {op!r}; known: {known}") from None


def valid_choices(op: Op) -> list[str]:
    """What a user may force for `op`: an implementation name or a kind it has."""
    kinds = [k for k in KINDS if any(i.kind == k for i in op.impls)]
    return op.names() + [k for k in kinds if k not in op.names()]
