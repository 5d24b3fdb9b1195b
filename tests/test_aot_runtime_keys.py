"""A kernel wheel's entry is found only when the JIT, meeting a real call, computes the key the
AOT compile computed. Both sides are simulated here with Triton's own binder (the function
``JITFunction.run`` builds from the kernel's signature: types, 16-byte divisibility, an int
equal to 1 turned into a constexpr, ROCm's 2 GiB pointer range, the ints a kernel leaves
unspecialised on divisibility) for a target arch, without
compiling: the call from its launch plan's arguments, the wheel from what ``compile_spec``
hands the JIT for each spec and int variant. A spec that names a unit stride as an int
(RoPE's last x stride, rope_positions' positions stride, kv_cache_append's one new token)
is never found: the declarations set ``aot_unit_ints``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

import torch

import greta_core.torch  # noqa: F401  (imports every declared op)
from greta_core.kernel_wheels import aot
from greta_core.ops import attention_bwd as bwd_ops
from greta_core.ops._plan import In, Out
from greta_core.ops.declare import DECLARED, Meta, aot_specs

ARCHS = ("sm_90", "gfx942")
ROOT = Path(__file__).resolve().parent.parent
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
        # The kernel's own choices of what not to specialise (attention's lengths and head
        # counts), which the interpreter keeps in its keyword arguments.
        given = getattr(kernel, "kwargs", None) or vars(kernel)
        flags = ("do_not_specialize", "do_not_specialize_on_alignment")
        jit = JITFunction(kernel.fn, **{f: given.get(f) for f in flags})
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
        for variant in aot.variants_of(aot.int_kind(spec), aot.VARIANTS, module):
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


def _covered(op: Any, key: tuple, variants: tuple[str, ...]) -> bool:
    """Whether the wheel compiles the call's ints: its own case's (``aot_case_ints``), or
    all 16-divisible (or units), or none: the two int variants. A mix is compiled by no
    variant (it compiles on first use)."""
    if op.aot_case_ints:
        return True
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
                if _covered(op, key, aot.precompiled_int_variants(key[0])):
                    assert key in wheel, (op.name, key)
                    found[op.name] = found.get(op.name, 0) + 1
    for name in ("rope", "rope_positions", "matmul", "rms_norm", "layer_norm", "softmax",
                 "attention", "attention_bwd"):  # fmt: skip
        assert found.get(name), (name, found)


def _hf(batch: int, heads: int, seq: int, dim: int, dtype: str) -> CallTensor:
    """A [B, H, S, D] tensor as transformers' attention hands it over: the [B, S, H, D]
    projection viewed through ``transpose(1, 2)``."""
    return CallTensor(
        Meta((batch, heads, seq, dim), (seq * heads * dim, dim, heads * dim, 1), dtype)
    )


def _cache(batch: int, heads: int, seq: int, dim: int, dtype: str) -> CallTensor:
    """Keys or values of a KV cache: contiguous [B, Hkv, Skv, D] (DynamicCache's cat)."""
    return CallTensor(Meta.contiguous((batch, heads, seq, dim), dtype))


# Calls transformers' attention hook makes (greta_core/transformers/attention.py), at shapes
# and models that are not the declaration's cases: (query heads, KV heads, head dim, dtype).
_MODELS = {
    "llama-3.1-8b": (32, 8, 128, "bfloat16"),
    "qwen2.5-0.5b": (14, 2, 64, "bfloat16"),  # group 7, query heads not 16-divisible
    "llama-3.2-3b": (24, 8, 128, "float16"),
    "llama-2-7b": (32, 32, 128, "float16"),  # MHA: the group is the constant 1
}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("model", sorted(_MODELS))
@pytest.mark.parametrize("seq", [4096, 333])
def test_apply_greta_attention_calls_find_their_precompiled_entries(
    arch: str, model: str, seq: int
) -> None:
    """A prefill (causal, Sq == Skv), a decode step (one query over `seq` cached keys, not
    causal) and, in training, the backward (do as the transpose of the hook's contiguous
    [B, S, H, D] output's gradient): each launch's key, as the JIT computes it for the call,
    is one of the wheel's, whose cases are 2048 tokens and 32 query heads. The lengths and
    head counts differ from the cases' and are 16-divisible or not; the backward's query
    length is specialised on it and the wheel holds both (MHA's group is the constexpr 1)."""
    heads_q, heads_kv, dim, dtype = _MODELS[model]
    fwd, bwd = DECLARED["attention"], DECLARED["attention_bwd"]
    wheel = wheel_keys(fwd, arch)
    q, kv = _hf(2, heads_q, seq, dim, dtype), _hf(2, heads_kv, seq, dim, dtype)
    prefill = runtime_keys(fwd, arch, [q, kv, kv, None, None], (True, dim**-0.5, False))
    decode = runtime_keys(
        fwd, arch, [_hf(2, heads_q, 1, dim, dtype), *[_cache(2, heads_kv, seq, dim, dtype)] * 2,
                    None, None], (False, dim**-0.5, False),
    )  # fmt: skip
    assert ("constexpr", 1) in decode[0][2]  # Sq == 1
    for key in (*prefill, *decode):
        assert key in wheel, (model, seq, key)
    if dtype in bwd_ops.AOT_DTYPES and heads_q != heads_kv:  # MHA's: first use
        keys = runtime_keys(bwd, arch, *_bwd_args(heads_q, heads_kv, seq, dim, dtype))
        assert len(keys) == 3  # delta, dkdv, dq
        assert set(keys) <= wheel_keys(bwd, arch), (model, seq)


def _lens(n: int) -> CallTensor:
    return CallTensor(Meta.contiguous((n,), "int32"))


# Calls the wheel leaves to first use (docs/en/kernel_wheels.md, Limits), each with the
# kernels it compiles then: (description, op, tensors, scalars).
_FIRST_USE = {
    "raw API lengths": lambda: (
        "attention",
        [_cache(2, 32, 2048, 128, "bfloat16"), *[_cache(2, 8, 2048, 128, "bfloat16")] * 2,
         _lens(2), _lens(2)],
        (True, None, False),
    ),
    "8-token prompt": lambda: (
        "attention",
        [_hf(1, 32, 8, 128, "bfloat16"), *[_hf(1, 8, 8, 128, "bfloat16")] * 2, None, None],
        (True, None, False),
    ),
    "fp16 backward": lambda: ("attention_bwd", *_bwd_args(32, 8, 2048, 128, "float16")),
    "MHA backward": lambda: ("attention_bwd", *_bwd_args(32, 32, 2048, 128, "bfloat16")),
}  # fmt: skip


def _bwd_args(heads_q: int, heads_kv: int, seq: int, dim: int, dtype: str) -> tuple:
    q, kv = _hf(2, heads_q, seq, dim, dtype), _hf(2, heads_kv, seq, dim, dtype)
    o = CallTensor(Meta.contiguous((2, heads_q, seq, dim), dtype))
    lse = CallTensor(Meta.contiguous((2, heads_q, seq), "float32"))
    return [q, q, kv, kv, o, lse], (True, dim**-0.5)


@pytest.mark.parametrize("call", sorted(_FIRST_USE))
def test_calls_the_wheel_leaves_to_first_use_are_not_in_it(call: str) -> None:
    """What the docs name as compiled on first use is not in the gfx942 wheel: at least one
    of the call's launches misses it (the rest of the call may hit: the MHA backward's
    delta kernel is GQA's)."""
    op_name, tensors, scalars = _FIRST_USE[call]()
    op = DECLARED[op_name]
    keys = runtime_keys(op, "gfx942", tensors, scalars)
    assert keys and not set(keys) <= wheel_keys(op, "gfx942"), call


# Run without TRITON_INTERPRET (under it @triton.jit gives interpreted functions).
_LOOKUP = """
import json, sys
from pathlib import Path

import torch

from greta_core import observe
from greta_core.kernel_wheels import aot, precompiled
from greta_core.ops._plan import In
from greta_core.ops.attention import ATTENTION
from greta_core.ops.declare import Meta, not_specialised

arch, wheel, cache = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
# Qwen2.5-0.5B's prefill of a 333-token prompt, as transformers' hook hands it over.
q = torch.empty(2, 333, 14, 64, dtype=torch.bfloat16).transpose(1, 2)
k = torch.empty(2, 333, 2, 64, dtype=torch.bfloat16).transpose(1, 2)
tensors = [q, k, k.clone(), None, None]
plan = ATTENTION.plan_for(arch, [None if t is None else Meta.of(t) for t in tensors], (True, 0.125))
[launch] = plan.launches
bufs = [torch.empty(b.shape, dtype=getattr(torch, b.dtype)) for b in plan.buffers]
args = [tensors[a.index] if type(a) is In else bufs[a.index] if type(a).__name__ == "Out"
        else a for a in launch.args]
unaligned, _ = not_specialised(launch.kernel)  # the lengths and head counts
ints = {n: a % 16 == 0 for n, a in zip(launch.kernel.arg_names, launch.args)
        if type(a) is int and a != 1 and n not in unaligned}
units = {n: 1 for n, a in zip(launch.kernel.arg_names, launch.args) if type(a) is int and a == 1}
# The wheel's one entry for this call: the spec of its kernel, tiles and ints' divisibility.
[found] = aot.discover(arch, ["attention"])
[spec] = [s for s in found.specs if s.int_divisible == ints and s.signature["q_ptr"] == "*bf16"
          and s.constexprs == {**launch.constexprs, **units} and s.options == launch.options]
with aot.compiling_for(arch, wheel):
    res = aot.compile_spec(spec, "attention", arch, aot.CASE)
assert res.ok, res.error
launch.kernel.device_caches.clear()  # the JIT must look the code up, not remember it
with aot.compiling_for(arch, cache):
    precompiled.add_root(wheel)
    launch.kernel.warmup(*args, grid=launch.grid, **launch.constexprs, **launch.options)
print(json.dumps({"spec": spec.name, "code": observe.kernel_code_counts(),
                  "compiled": sorted(p.name for p in cache.rglob("*.json"))}))
"""


# One compile in CI (gfx942's is the cheaper); sm_90's runs with `-m slow`.
@pytest.mark.parametrize("arch", ["gfx942", pytest.param("sm_90", marks=pytest.mark.slow)])
def test_a_real_attention_call_takes_the_wheels_code(arch: str, tmp_path: Path) -> None:
    """End to end for one kernel (a full wheel is too slow for CI): the `arch` entry of the
    attention spec a Qwen2.5-0.5B prefill needs (333 tokens, 14 query heads and a group of 7,
    none 16-divisible; the spec's case has 2048 tokens and 32/8 heads) is compiled into a
    directory; then the JIT meets the real call (torch tensors in transformers' layout, the
    plan's arguments) and finds its code through the kernel-wheel cache manager
    (greta_core.kernel_wheels.precompiled): served, nothing compiled into Triton's own
    cache."""
    script = tmp_path / "lookup.py"
    script.write_text(_LOOKUP)
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(script), arch, str(tmp_path / "wheel"), str(tmp_path / "cache")],
        env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["spec"].endswith(";ragged=]"), out["spec"]  # the strides: all 16-divisible
    assert out["code"] == {"attention_fwd_kernel": {"precompiled": 1, "compiled": 0}}
    assert out["compiled"] == []


@pytest.mark.parametrize("arch", ARCHS)
def test_cases_that_meet_one_key_make_one_spec(arch: str) -> None:
    """Specs are deduplicated by the JIT's key, not by the cases' ints: two prefill cases whose
    lengths and head counts differ in 16-divisibility (2048 tokens, 32/8 heads; 1037 tokens,
    28/4) are one key and one spec, while the backward, which keeps the query length
    specialised, makes one spec per kernel for each."""
    import dataclasses

    def meta(t: CallTensor) -> Meta:
        return Meta(t.shape, t.stride(), str(t.dtype).removeprefix("torch."))

    shapes = ((32, 8, 2048), (28, 4, 1037))
    fwd, bwd = DECLARED["attention"], DECLARED["attention_bwd"]
    prefills = [[_hf(1, hq, seq, 128, "bfloat16"), *[_hf(1, hkv, seq, 128, "bfloat16")] * 2,
                 None, None] for hq, hkv, seq in shapes]  # fmt: skip
    cases = [(meta(q), meta(k), meta(v), None, None, True, None, False) for q, k, v, *_ in prefills]
    one = dataclasses.replace(fwd, aot_cases=lambda a: cases)
    assert len(aot_specs(one, arch)) == 1
    keys = {k for p in prefills for k in runtime_keys(fwd, arch, p, (True, None, False))}
    assert len(keys) == 1 and keys <= wheel_keys(one, arch)
    backwards = [_bwd_args(hq, hkv, seq, 128, "bfloat16") for hq, hkv, seq in shapes]
    bwd_cases = [(*map(meta, ts), *scalars) for ts, scalars in backwards]
    two = dataclasses.replace(bwd, aot_cases=lambda a: bwd_cases)
    assert len(aot_specs(two, arch)) == 2 * 3  # delta, dkdv, dq at each query length


@pytest.mark.parametrize("arch", ARCHS)
def test_a_table_with_the_one_launch_norm_backward_finds_both_forms(arch: str) -> None:
    """A table that turns the norms' one-launch backward on (``norm_bwd_reduce``): calls of
    a few rows (one launch, REDUCE_LAST) and of many (two launches), bf16 with fp32
    weights, at every width the AOT cases cover, find their keys in the wheel that table
    builds."""
    from greta_core import configs
    from greta_core.configs.blocks import aot_widths

    forms: set[bool] = set()
    with configs.Override({"norm_bwd_reduce": {"MAX_PARTIALS": 2 * 4096}}):
        for name in ("rms_norm_bwd", "add_rms_norm_bwd", "layer_norm_bwd"):
            op = DECLARED[name]
            wheel = wheel_keys(op, arch)
            for n in aot_widths(name, arch):
                # 4 programs (one launch up to N 2048), and 128+ (under 2 GiB a tensor: ROCm)
                for rows in (16, 2**14):
                    x, w = Meta.contiguous((rows, n), "bfloat16"), Meta.contiguous((n,), "float32")
                    stat = Meta.contiguous((rows,), "float32")
                    metas = {"rms_norm_bwd": (x, x, w, stat), "add_rms_norm_bwd": (x, x, x, w, stat),
                             "layer_norm_bwd": (x, x, w, stat, stat)}[name]  # fmt: skip
                    keys = runtime_keys(op, arch, [CallTensor(m) for m in metas], ())
                    for key in keys:
                        if _covered(op, key, aot.precompiled_int_variants(key[0])):
                            assert key in wheel, (name, rows, n, key)
                    forms.add(len(keys) == 1)
    assert forms == {True, False}
