"""The norms' backward in one launch (``REDUCE_LAST``: the last program to finish adds the
fp32 partials), taken where ``norm_bwd_reduce``'s MAX_PARTIALS allows it: the same
gradients as the reference and, bit for bit, as the two-launch form (kernel + col_sum) at
the same program count; the counter it uses is zero again after each call. Off in every
shipped table: these tests turn it on with ``configs.Override``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from _kernel_testing import DEVICE, ON_GPU, assert_close, expected_impl, need_triton  # noqa: E402

import greta_core.torch  # noqa: E402, F401
from greta_core import configs, observe, raw  # noqa: E402
from greta_core.ops._plan import In, Out  # noqa: E402
from greta_core.ops.declare import DECLARED, Meta, aot_specs  # noqa: E402

# GRETA's kernels in training too (the tables hand small norm/softmax training calls to torch).
pytestmark = pytest.mark.usefixtures("greta_training")

OPS = ("rms_norm", "add_rms_norm", "layer_norm")
# 7 rows: ceil(sqrt(7)) = 3 programs, the rows no multiple of them. A 16-column block and
# an unroll of 2 in the last program: several column blocks, a masked partial row.
ROWS, N = 7, 40
ON = {"norm_bwd_reduce": {"MAX_PARTIALS": 10**6, "BLOCK_R": 16, "BLOCK_P": 2}}
EPS = 1e-6


def _rms(xd: Any, wd: Any) -> Any:
    return xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + EPS) * wd


def _case(op: str, dtype: Any, rows: int = ROWS, n: int = N) -> tuple[tuple[Any, ...], Any]:
    """(the backward's raw arguments, its float64 reference gradients)."""
    gen = torch.Generator().manual_seed(0)

    def t(*shape: int, dt: Any = dtype) -> Any:
        return torch.randn(*shape, generator=gen, dtype=torch.float32).to(DEVICE, dt)

    x, w, dy = t(rows, n), t(n, dt=torch.float32), t(rows, n)
    if op == "rms_norm":
        _, rstd = raw.rms_norm_fwd(x, w, EPS)
        xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
        return (dy, x, w, rstd), torch.autograd.grad(_rms(xd, wd), (xd, wd), dy.double())
    if op == "add_rms_norm":
        ds = t(rows, n)
        _, s, rstd = raw.add_rms_norm_fwd(x, t(rows, n), w, EPS)
        sd, wd = s.double().requires_grad_(), w.double().requires_grad_()
        gs, gw = torch.autograd.grad(_rms(sd, wd), (sd, wd), dy.double())
        return (dy, ds, s, w, rstd), (gs + ds.double(), gw)
    b = t(n, dt=torch.float32)
    _, mean, rstd = raw.layer_norm_fwd(x, w, b, 1e-5)
    xd, wd, bd = (v.double().requires_grad_() for v in (x, w, b))
    ref = torch.nn.functional.layer_norm(xd, (n,), wd, bd, 1e-5)
    return (dy, x, w, mean, rstd), torch.autograd.grad(ref, (xd, wd, bd), dy.double())


def _bwd(op: str) -> Callable[..., tuple[Any, ...]]:
    return getattr(raw, f"{op}_bwd")


def _plan_of(op: str, args: tuple[Any, ...]) -> Any:
    decl = DECLARED[f"{op}_bwd"]
    return decl.plan(decl.validate(*args), *(Meta.of(a) for a in args))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("op", OPS)
def test_one_launch_gives_the_reference_and_the_two_launch_bits(op: str, dtype: Any) -> None:
    need_triton()
    args, ref = _case(op, dtype)
    with configs.Override(ON):
        plan = _plan_of(op, args)
        one = _bwd(op)(*args)
    assert len(plan.launches) == 1 and plan.launches[0].grid == (3,)
    assert plan.launches[0].constexprs["REDUCE_LAST"] is True
    assert observe.last_implementation(f"{op}_bwd") == expected_impl()
    with configs.Override({f"{op}_bwd": {"PROGRAMS": 3}}):  # the same rows per program
        assert len(_plan_of(op, args).launches) == 2
        two = _bwd(op)(*args)
    assert len(one) == len(ref)
    for got, want in zip(one, two, strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want)
    assert one[0].dtype == dtype and all(g.dtype == torch.float32 for g in one[1:])
    assert_close(one[0], ref[0], dtype, scale=2.0)
    for got, want in zip(one[1:], ref[1:], strict=True):
        assert_close(got, want, dtype, scale=4.0)  # sums over rows


@pytest.mark.parametrize("op", OPS)
def test_the_looped_rows_reduce_in_one_launch_too(op: str) -> None:
    """Rows wider than the block (ONE_PASS off: partial rows zeroed, then read back and
    added to) take the one-launch form the same way."""
    need_triton()
    args, _ = _case(op, torch.float32)
    looped = {f"{op}_bwd": {"MAX_BLOCK_N": 16, "LOOP_BLOCK_N": 16}}
    with configs.Override({**ON, **looped}):
        plan = _plan_of(op, args)
        one = _bwd(op)(*args)
    assert plan.launches[0].constexprs["ONE_PASS"] is False and len(plan.launches) == 1
    with configs.Override({f"{op}_bwd": {**looped[f"{op}_bwd"], "PROGRAMS": 3}}):
        two = _bwd(op)(*args)
    for got, want in zip(one, two, strict=True):
        assert torch.equal(got, want)


def _run(plan: Any, inputs: tuple[Any, ...], bufs: list[Any]) -> None:
    """Each launch of `plan` on `bufs` (the plan's buffers, given)."""
    for launch in plan.launches:
        args = [
            inputs[a.index] if type(a) is In else bufs[a.index] if type(a) is Out else a
            for a in launch.args
        ]
        launch.kernel[launch.grid](*args, **launch.constexprs, **launch.options)


@pytest.mark.parametrize("op", OPS)
def test_the_counter_is_zero_again_after_each_call(op: str) -> None:
    """The one-launch plan's last buffer is its int32 counter (zeroed, scratch): the
    kernel leaves it 0, so the next call may use it as is; NaN-filled gradients are all
    written."""
    need_triton()
    args, _ = _case(op, torch.float32)
    with configs.Override(ON):
        plan = _plan_of(op, args)
        want = _bwd(op)(*args)
    counter = plan.buffers[-1]
    assert (counter.shape, counter.dtype, counter.zeroed) == ((1,), "int32", True)
    assert len(plan.buffers) - 1 not in plan.results
    bufs = [
        torch.zeros(b.shape, dtype=torch.int32, device=DEVICE) if b.zeroed
        else torch.full(b.shape, float("nan"), dtype=getattr(torch, b.dtype), device=DEVICE)
        for b in plan.buffers
    ]  # fmt: skip
    for _ in range(2):  # the second call reuses the counter as the first left it
        for i in plan.results[1:]:
            bufs[i].fill_(float("nan"))
        _run(plan, args, bufs)
        assert bufs[-1].item() == 0
        for got, expected in zip((bufs[i] for i in plan.results), want, strict=True):
            assert torch.equal(got, expected)


@pytest.mark.parametrize("op", OPS)
def test_the_bound_decides_one_launch_or_two(op: str) -> None:
    """Planning only: off (the shipped tables' 0) two launches; on, one launch of
    ceil(sqrt(rows)) programs while programs * N * params <= MAX_PARTIALS, two above."""
    params = 2 if op == "layer_norm" else 1
    rows, n = 256, 2048  # a 1B model's B1 x S256 step: 16 programs of 16 rows
    x, w = Meta.contiguous((rows, n), "bfloat16"), Meta.contiguous((n,), "float32")
    stat = Meta.contiguous((rows,), "float32")
    metas = {"rms_norm": (x, x, w, stat), "add_rms_norm": (x, x, x, w, stat),
             "layer_norm": (x, x, w, stat, stat)}[op]  # fmt: skip
    plan = DECLARED[f"{op}_bwd"].plan
    off = plan("sm_90", *metas)
    assert len(off.launches) == 2 and off.launches[0].constexprs["REDUCE_LAST"] is False
    assert len(off.buffers) == 2 + params  # dx, partials, the gradients: no counter
    at = 16 * n * params
    with configs.Override({"norm_bwd_reduce": {"MAX_PARTIALS": at}}):
        on = plan("sm_90", *metas)
    assert len(on.launches) == 1 and on.launches[0].grid == (16,)
    assert on.buffers[1].shape == (16 * params, n) and on.results == off.results
    with configs.Override({"norm_bwd_reduce": {"MAX_PARTIALS": at - 1}}):
        over = plan("sm_90", *metas)
    assert len(over.launches) == 2 and over.launches[0].grid == off.launches[0].grid


def test_torch_ops_training_path_in_one_launch_gives_the_two_launch_bits() -> None:
    """torch.ops.greta's forward + backward (autograd) with the bound on: the gradients
    of the two-launch form at the same program count, for each norm."""
    need_triton()
    gen = torch.Generator().manual_seed(1)

    def t(*shape: int) -> Any:
        return torch.randn(*shape, generator=gen).to(DEVICE).requires_grad_()

    x, r, w, b = t(ROWS, N), t(ROWS, N), t(N), t(N)
    calls = {
        "rms_norm": (lambda: torch.ops.greta.rms_norm(x, w, EPS), (x, w)),
        "add_rms_norm": (lambda: torch.ops.greta.add_rms_norm(x, r, w, EPS), (x, r, w)),
        "layer_norm": (lambda: torch.ops.greta.layer_norm(x, w, b, 1e-5), (x, w, b)),
    }
    for op, (fn, inputs) in calls.items():

        def grads(fn: Any = fn, inputs: Any = inputs) -> tuple[Any, ...]:
            out = fn()
            outs = out if isinstance(out, tuple) else (out,)
            return torch.autograd.grad(outs, inputs, [torch.ones_like(o) for o in outs])

        with configs.Override(ON):
            one = grads()
            assert observe.last_implementation(f"{op}_bwd") == expected_impl()
        with configs.Override({f"{op}_bwd": {"PROGRAMS": 3}}):
            two = grads()
        for got, want in zip(one, two, strict=True):
            assert torch.equal(got, want), op


def test_aot_specs_hold_the_one_launch_variant_only_where_a_table_turns_it_on() -> None:
    """Derived from the plans: with the shipped bound (0) no REDUCE_LAST variant is in a
    wheel; a table that turns it on gets it for the widths where a call of a few rows can
    take it (2 programs: 2 * N * params <= MAX_PARTIALS) and keeps every two-launch
    variant."""

    def key(spec: Any) -> tuple[Any, ...]:
        return (tuple(spec.signature.items()), tuple(sorted(spec.constexprs.items())),
                tuple(sorted(spec.options.items())))  # fmt: skip

    def kernel_specs() -> list[Any]:  # the norm kernel's (col_sum's are its own)
        specs = aot_specs(DECLARED["rms_norm_bwd"], "gfx942")
        return [s for s in specs if s.kernel.__name__ == "rms_norm_bwd_kernel"]

    off = kernel_specs()
    assert off and not any(s.constexprs["REDUCE_LAST"] for s in off)
    with configs.Override({"norm_bwd_reduce": {"MAX_PARTIALS": 8192}}):
        on = kernel_specs()
    one = [s for s in on if s.constexprs["REDUCE_LAST"]]
    assert {key(s) for s in on if not s.constexprs["REDUCE_LAST"]} == {key(s) for s in off}
    assert one and all(s.signature["counter_ptr"] == "*i32" for s in one)
    blocks = {s.constexprs["BLOCK_N"] for s in one}
    assert max(blocks) == 4096 and max(s.constexprs["BLOCK_N"] for s in off) > 4096


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
def test_gpu_one_launch_is_the_two_launch_form_bit_for_bit(op: str) -> None:
    """On the GPU (what the interpreter cannot show: programs running at once, the
    atomic's ordering): the one-launch form, run many times through the raw API and the
    eager training path (ready launch, counter in the scratch arena's header), gives the
    two-launch form's bits at the same program count, and leaves the header zero."""
    from greta_core.ops import _calls

    assert ON_GPU
    args, _ = _case(op, torch.bfloat16, rows=256, n=2048)
    with configs.Override({f"{op}_bwd": {"PROGRAMS": 16}}):
        two = _bwd(op)(*args)
    bound = {"norm_bwd_reduce": {"MAX_PARTIALS": 16 * 2048 * 2}}
    with configs.Override(bound):
        assert _plan_of(op, args).launches[0].grid == (16,)
        for _ in range(50):
            for got, want in zip(_bwd(op)(*args), two, strict=True):
                assert torch.equal(got, want)
    x = torch.randn(256, 2048, device="cuda", dtype=torch.bfloat16).requires_grad_()
    w = torch.randn(2048, device="cuda").requires_grad_()
    fns = {"rms_norm": lambda: (torch.ops.greta.rms_norm(x, w, EPS),),
           "add_rms_norm": lambda: torch.ops.greta.add_rms_norm(x, x.detach(), w, EPS),
           "layer_norm": lambda: (torch.ops.greta.layer_norm(x, w, None, 1e-5),)}  # fmt: skip

    def grads() -> tuple[Any, ...]:
        outs = fns[op]()
        return torch.autograd.grad(outs, (x, w), [torch.ones_like(o) for o in outs])

    with configs.Override({f"{op}_bwd": {"PROGRAMS": 16}}):
        want = grads()
    with configs.Override(bound):
        for _ in range(20):  # the first call captures, the others take the ready launch
            for got, expected in zip(grads(), want, strict=True):
                assert torch.equal(got, expected)
    torch.cuda.synchronize()
    arenas = [a for key, a in _calls._ARENAS.items() if key[0] == torch.cuda.current_device()]
    assert arenas and all(not a[2][: _calls.ARENA_HEADER].any() for a in arenas)


def test_amd_plans_make_each_wave_wait_for_its_stores() -> None:
    """Triton's barrier on AMD does not wait for a wave's stores (gfx942's code shows a bare
    s_barrier): the one-launch plan for a HIP arch sets WAIT_STORES to its family's wait,
    0 elsewhere and in the two-launch form."""
    from greta_core.ops._rows import store_wait

    archs = ("sm_90", "cpu", "gfx942", "gfx90a", "gfx1100", "gfx1030", "gfx1201")
    assert [store_wait(a) for a in archs] == [0, 0, 1, 1, 2, 2, 3]
    x, w = Meta.contiguous((16, 64), "bfloat16"), Meta.contiguous((64,), "float32")
    stat = Meta.contiguous((16,), "float32")
    plan = DECLARED["rms_norm_bwd"].plan
    assert plan("gfx942", x, x, w, stat).launches[0].constexprs["WAIT_STORES"] == 0
    with configs.Override({"norm_bwd_reduce": {"MAX_PARTIALS": 10**6}}):
        for arch, wait in (("gfx942", 1), ("gfx1100", 2), ("gfx1201", 3), ("sm_90", 0)):
            (launch,) = plan(arch, x, x, w, stat).launches
            assert launch.constexprs["WAIT_STORES"] == wait


# Compiles rms_norm's one-launch backward (bf16, N 2048) for sm_90 and the three AMD families
# without a GPU (the kernel-wheel build's way) and prints each one's assembly lines as JSON.
_COMPILE = r"""
import json, sys, tempfile
from greta_core import configs
from greta_core.kernel_wheels import aot
from greta_core.ops.declare import DECLARED, aot_specs
import greta_core.ops.rms_norm

out = {}
for arch, key in (("sm_90", "ptx"), ("gfx942", "amdgcn"), ("gfx1100", "amdgcn"),
                  ("gfx1201", "amdgcn")):
    with configs.Override({"norm_bwd_reduce": {"MAX_PARTIALS": 65536}}):
        spec = next(
            s for s in aot_specs(DECLARED["rms_norm_bwd"], arch)
            if s.constexprs.get("REDUCE_LAST") and s.constexprs["BLOCK_N"] == 2048
            and s.signature["dy_ptr"] == "*bf16"
        )
    ints = aot.int_args_for(spec, "aligned")
    args = [spec.constexprs[n] if n in spec.constexprs
            else aot._stand_in(n, spec.signature[n], ints) for n in spec.kernel.arg_names]
    with tempfile.TemporaryDirectory() as d, aot.compiling_for(arch, d):
        spec.kernel.device_caches.clear()
        compiled = spec.kernel.warmup(*args, grid=(1,), **aot._jit_options(spec))
    out[arch] = [line.strip() for line in compiled.asm[key].splitlines()]
print(json.dumps(out))
"""


def test_compiled_one_launch_orders_the_partials_before_the_count() -> None:
    """What the docstring of ``kernels._rows._reduce_last`` claims, in the compiled code
    (Triton's own lowering, no GPU needed): on sm_90 bar.sync, then the acq_rel gpu-scope
    atomic, then ``.cg`` loads of the partials; on gfx942 every wave's wait for its stores
    before s_barrier, then the release write-back, the atomic, the acquire invalidate."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "TRITON_INTERPRET": "0"}
    proc = subprocess.run([sys.executable, "-c", _COMPILE], env=env, capture_output=True,
                          text=True, timeout=300, check=True)  # fmt: skip
    asm = json.loads(proc.stdout.splitlines()[-1])

    def first(lines: list[str], text: str, after: int = -1) -> int:
        return next(i for i, line in enumerate(lines) if i > after and text in line)

    ptx = asm["sm_90"]
    atom = first(ptx, "atom.global.gpu.acq_rel.add")
    store = max(
        i for i, line in enumerate(ptx[:atom]) if line.startswith("@") and "st.global" in line
    )
    assert store < first(ptx, "bar.sync", store) < atom < first(ptx, "ld.global.cg", atom)
    gcn = asm["gfx942"]
    atom = first(gcn, "global_atomic_add")
    barrier = max(i for i, line in enumerate(gcn[:atom]) if line == "s_barrier")
    store = max(i for i, line in enumerate(gcn[:barrier]) if "_store_" in line)
    assert store < first(gcn, "s_waitcnt vmcnt(0)", store) < barrier
    assert barrier < first(gcn, "buffer_wbl2 sc1", barrier) < atom
    assert atom < first(gcn, "buffer_inv sc1", atom)
    # RDNA 3 and 4 count stores apart from loads: their own wait, between the last partial
    # store and the barrier (WAIT_STORES 2 and 3).
    for arch, wait in (
        ("gfx1100", "s_waitcnt_vscnt null, 0x0"),
        ("gfx1201", "s_wait_storecnt 0x0"),
    ):
        gcn = asm[arch]
        atom = first(gcn, "global_atomic_add")
        barrier = max(i for i, line in enumerate(gcn[:atom]) if line.startswith("s_barrier"))
        store = max(i for i, line in enumerate(gcn[:barrier]) if "_store_" in line)
        assert store < first(gcn, wait, store) < barrier, arch
