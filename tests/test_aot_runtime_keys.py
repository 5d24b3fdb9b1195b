"""A kernel wheel's entry is found only when the JIT, meeting a real call, computes the key the
AOT compile computed. Both sides are simulated here with Triton's own binder (the function
``JITFunction.run`` builds from the kernel's signature: types, 16-byte divisibility, an int
equal to 1 turned into a constexpr, ROCm's 2 GiB pointer range) for a target arch, without
compiling: the call from its launch plan's arguments, the wheel from what ``compile_spec``
hands the JIT for each spec and int variant. A spec that names a unit stride as an int
(RoPE's last x stride, rope_positions' positions stride, kv_cache_append's one new token)
is never found: the declarations set ``aot_unit_ints``.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

import torch

import greta_core.torch  # noqa: F401  (imports every declared op)
from greta_core.kernel_wheels import aot
from greta_core.ops._plan import In, Out
from greta_core.ops.declare import DECLARED, Meta, aot_specs

ARCHS = ("sm_90", "gfx942")
_BINDERS: dict[tuple[str, str], Any] = {}


class CallTensor:
    """What the JIT reads of a call's tensor, without allocating it: shape and strides (for
    the plan), dtype, a 16-byte aligned address (a fresh allocation's) and the bytes its
    storage spans (ROCm's buffer-ops attribute: at most 2 GiB)."""

    def __init__(self, meta: Meta) -> None:
        self.shape, self._strides = meta.shape, meta.strides
        self.dtype = getattr(torch, meta.dtype)
        last = sum((n - 1) * s for n, s in zip(meta.shape, meta.strides, strict=True))
        self.span = 0 if 0 in meta.shape else (last + 1) * self.dtype.itemsize

    def stride(self) -> tuple[int, ...]:
        return self._strides

    def data_ptr(self) -> int:
        return 0

    def ptr_range(self) -> int:
        return self.span


def _binder(kernel: Any, arch: str) -> Any:
    """Triton's binder for `kernel` on `arch` (built from the plain function, so it is the
    JIT's even while TRITON_INTERPRET=1 makes `kernel` an interpreted function)."""
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    key = (f"{kernel.fn.__module__}.{kernel.fn.__name__}", arch)
    if key not in _BINDERS:
        jit = JITFunction(kernel.fn)
        backend = make_backend(aot.target_for(arch))
        _BINDERS[key] = create_function_from_signature(jit.signature, jit.params, backend)
    return _BINDERS[key]


def _module(kernel: Any) -> str:
    return kernel.fn.__module__.rsplit(".", 1)[-1]


def _key(kernel: Any, arch: str, args: list[Any], keywords: dict[str, Any]) -> tuple:
    """(kernel module, kernel, the JIT's specialisation of the arguments, options)."""
    _, specialization, options = _binder(kernel, arch)(*args, **keywords)
    return (_module(kernel), kernel.fn.__name__, tuple(specialization),
            tuple(sorted(options.items())))  # fmt: skip


def wheel_keys(op: Any, arch: str) -> set[tuple]:
    """The keys of every entry the kernel wheel compiles for `op`'s specs on `arch`."""
    keys = set()
    for spec in aot_specs(op, arch):
        names = list(spec.kernel.arg_names)
        module = _module(spec.kernel)
        for variant in aot.variants_of(aot.has_int_args(spec), aot.VARIANTS, module):
            ints = aot.int_args_for(spec, variant)
            args = [
                spec.constexprs[n] if n in spec.constexprs
                else aot._stand_in(n, spec.signature[n], ints)
                for n in names
            ]  # fmt: skip
            keys.add(_key(spec.kernel, arch, args, dict(spec.options)))
    return keys


def runtime_keys(op: Any, arch: str, tensors: list[Any], scalars: tuple) -> list[tuple]:
    """The key of each launch of a call on `tensors` (torch tensors or CallTensors; None for
    an absent optional one), planned from their Metas as the call path does."""
    plan = op.plan(arch, *(None if t is None else Meta.of(t) for t in tensors), *scalars)
    bufs = [
        tensors[b.alias] if b.alias is not None else CallTensor(Meta.contiguous(b.shape, b.dtype))
        for b in plan.buffers
    ]
    keys = []
    for launch in plan.launches:
        args = [
            tensors[a.index] if type(a) is In else bufs[a.index] if type(a) is Out else a
            for a in launch.args
        ]
        keys.append(_key(launch.kernel, arch, args, {**launch.constexprs, **launch.options}))
    return keys


def _rope() -> tuple[list[Any], tuple]:
    # A Llama prefill: x [B, S, H, D] bf16, HF's cos/sin batch-broadcast [1, S, D/2], fp32.
    x = torch.empty(2, 2048, 32, 128, dtype=torch.bfloat16)
    table = torch.empty(1, 2048, 64)
    return [x, table, table.clone()], (False,)


def _rope_positions() -> tuple[list[Any], tuple]:
    x = torch.empty(1, 512, 32, 64, dtype=torch.float16)
    return [x, torch.arange(512)], (1e4, True)  # positions [S] int64; the inverse (backward)


def _kv_cache_decode() -> tuple[list[Any], tuple]:
    # One decode step of a 32-head model: one new token per sequence.
    cache = [torch.empty(4, 32, 2048, 128, dtype=torch.bfloat16) for _ in range(2)]
    new = [torch.empty(4, 32, 1, 128, dtype=torch.bfloat16) for _ in range(2)]
    return [*cache, *new, torch.zeros(4, dtype=torch.int32)], ()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(
    ("op_name", "call"),
    [("rope", _rope), ("rope_positions", _rope_positions), ("kv_cache_append", _kv_cache_decode)],
)
def test_a_real_call_with_unit_ints_finds_its_precompiled_entry(
    arch: str, op_name: str, call: Any
) -> None:
    op = DECLARED[op_name]
    tensors, scalars = call()
    [key] = runtime_keys(op, arch, tensors, scalars)
    assert ("constexpr", 1) in key[2]  # the JIT made the unit int a constant...
    assert key in wheel_keys(op, arch)  # ...and so did the wheel's compile


def _covered(key: tuple, variants: tuple[str, ...]) -> bool:
    """Whether the call's ints are all 16-divisible (or units), or none is: the two int
    variants a wheel compiles. A mix is compiled by no variant (it compiles on first use)."""
    divisible = {attr == "D" for ty, attr in key[2] if ty in ("i32", "i64")}
    aligned = divisible <= {True} and "aligned" in variants
    return aligned or (divisible <= {False} and "ragged" in variants)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_aot_case_a_variant_covers_is_found_at_run_time(arch: str) -> None:
    """Each declared op's AOT cases, met as calls of exactly those shapes and dtypes: where a
    compiled int variant covers the call's ints, the call's key is one of the wheel's."""
    found: dict[str, int] = {}
    for op in DECLARED.values():
        if op.aot_cases is None:
            continue
        wheel = wheel_keys(op, arch)
        for case in op.aot_cases(arch):
            tensors = [None if m is None else CallTensor(m) for m in case[: op.n_tensors]]
            if arch.startswith("gfx") and any(t and t.span > 2**31 - 1 for t in tensors):
                # ROCm: a tensor over 2 GiB has no pointer-range attribute, while the
                # wheel's stand-ins always have it (swiglu's 2**31-element i64 cases).
                continue
            for key in runtime_keys(op, arch, tensors, tuple(case[op.n_tensors :])):
                if _covered(key, aot.precompiled_int_variants(key[0])):
                    assert key in wheel, (op.name, key)
                    found[op.name] = found.get(op.name, 0) + 1
    for name in ("rope", "rope_positions", "matmul", "rms_norm", "layer_norm", "softmax"):
        assert found.get(name), (name, found)
