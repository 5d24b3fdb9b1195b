"""linear_cross_entropy: validation, the chunk schedule and the per-chunk launch plan.

``loss = cross_entropy(hidden @ weight.T, target)`` without ever holding the [tokens,
vocab] logits: tokens go in chunks of :func:`chunk_rows` rows; per chunk a GEMM makes the
chunk's logits, the plan's Triton kernel turns them into the loss rows and (in place) into
``dlogits``, and two GEMMs add the chunk's share of the hidden and weight gradients. With
``with_grad`` the forward computes the gradients on the way (the backward only scales
them), as Liger-Kernel's fused linear cross-entropy does; reduction="none" gets its
gradient from :func:`linear_cross_entropy_bwd`, which redoes the chunks with per-row
scales. The GEMMs belong to each binding (torch.mm here and in torch.ops.greta,
jnp.dot in JAX); the chunk schedule and the kernel plan are shared.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from typing import Any

from greta_core import configs
from greta_core.errors import ConfigError, GretaInputError
from greta_core.kernels.linear_cross_entropy import (
    cross_entropy_rows_kernel,
    grid,
    scale_grid,
    scale_in_place_kernel,
)
from greta_core.observe import record, recorded
from greta_core.ops import _interp_compat
from greta_core.ops._calls import ForwardCall, capture_probe, tensors_as_given
from greta_core.ops._plan import Buffer, In, Launch, Out, Plan, Wrap, dtype_name, memo, run
from greta_core.ops._plan import _identity as _no_wrap
from greta_core.ops._rows import arch_for, check_array_float, float_dtypes
from greta_core.ops._validate import check_same_device, check_tensor
from greta_core.ops.declare import Backward, Front, OpDecl, declare

OP = "linear_cross_entropy"
REDUCTIONS = ("mean", "sum", "none")
_interp_compat.apply()


def validate(hidden: Any, weight: Any, target: Any, reduction: str, reference: bool = False) -> str:
    """hidden [N, H], weight [V, H] (same dtype), target int64 [N]. Raises GretaInputError."""
    import torch

    check_tensor(OP, "hidden", hidden, dtypes=float_dtypes(reference), ndim=2)
    check_tensor(OP, "weight", weight, dtypes=(hidden.dtype,), ndim=2)
    check_tensor(OP, "target", target, dtypes=(torch.int64,), ndim=1, contiguous=True)
    if weight.shape[1] != hidden.shape[1] or weight.shape[0] == 0:
        raise GretaInputError(
            f"{OP}: argument 'weight' has shape {tuple(weight.shape)}; expected "
            f"[vocab >= 1, {hidden.shape[1]}] (the hidden size of 'hidden')"
        )
    if target.shape[0] != hidden.shape[0]:
        raise GretaInputError(
            f"{OP}: argument 'target' has {target.shape[0]} entries; expected one per row "
            f"of 'hidden' ({hidden.shape[0]})"
        )
    if reduction not in REDUCTIONS:
        raise GretaInputError(
            f"{OP}: argument 'reduction' is {reduction!r}; expected one of {', '.join(REDUCTIONS)}"
        )
    check_same_device(OP, hidden=hidden, weight=weight, target=target)
    return arch_for(OP, hidden, reference)


def bad_target_message(value: int, vocab: int, ignore_index: int) -> str:
    return (
        f"{OP}: argument 'target' holds {value}; every entry must be in [0, {vocab}) "
        f"(the vocabulary of 'weight') or equal ignore_index ({ignore_index})"
    )


def _values_on_host(target: Any) -> bool:
    """A plain CPU tensor: its values are read without a device sync."""
    import torch

    return type(target) is torch.Tensor and target.is_cpu


def check_targets(target: Any, vocab: int, ignore_index: int) -> Any:
    """Refuse a target outside [0, vocab) that is not `ignore_index`, as torch's
    cross_entropy does (the kernels would read past the logits' row, torch's own a
    device-side assert). Returns the target to compute with.

    Values on the host (a CPU tensor) are checked here: GretaInputError. A GPU tensor's
    values are checked on the device, without the host sync a read would cost on every
    training call (:func:`screen_targets`): the returned target has each refused entry
    replaced by `ignore_index` (nothing reads out of bounds) and the refusal is raised by
    a later call (:func:`raise_refused_targets`); :func:`poison` makes the loss NaN
    meanwhile. Values of a traced (fake) or meta tensor are unknown and not checked."""
    return screen_targets(target, vocab, ignore_index)[0]


def screen_targets(
    target: Any, vocab: int, ignore_index: int, counted: bool = False, fill: bool = True
) -> tuple[Any, Any, Any]:
    """(the target to compute with, the device marks of its entries, their sum): see
    :func:`check_targets` and :func:`refuse_on_device`. The sum is NaN where an entry was
    refused (else 0, or with `counted` the number of entries that are classes) and is
    folded into the device's deferred report. Marks and sum are None where the values
    were checked on the host, or cannot be (fake, meta, empty). Without `fill` the target
    comes back as given, refused entries and all: for a caller that makes it safe itself
    (torch's cross_entropy: :func:`torch_targets`)."""
    if target.numel() == 0 or target.is_meta or _maybe_fake(target):
        return target, None, None
    if _values_on_host(target):
        refuse_on_host(target, vocab, ignore_index)
        return target, None, None
    raise_refused_targets()
    safe, marks = refuse_on_device(target, vocab, ignore_index, counted, fill)
    total = marks.sum()
    note_refusals(target, total, vocab, ignore_index)
    return safe, marks, total


def _maybe_fake(target: Any) -> bool:
    """A traced (fake) tensor, or a wrapper of one; a plain tensor that wraps nothing is
    told apart without is_fake's walk (the training path asks on every call)."""
    import torch

    if type(target) is torch.Tensor and not torch._is_functional_tensor(target):
        return False
    from torch._subclasses.fake_tensor import is_fake

    return is_fake(target)


def refuse_on_host(values: Any, vocab: int, ignore_index: int) -> None:
    """GretaInputError naming the first entry of `values` (a CPU tensor, a numpy array)
    outside [0, vocab) that is not `ignore_index`."""
    bad = ((values < 0) | (values >= vocab)) & (values != ignore_index)
    if bool(bad.any()):
        raise GretaInputError(bad_target_message(int(values[bad][0]), vocab, ignore_index))


def _classes(vocab: int, ignore_index: int) -> tuple[list[int], list[int]]:
    """(sorted boundaries, each bucket's kind): ``bucketize(x, boundaries, right=True)``
    puts x in bucket i where boundaries[i-1] <= x < boundaries[i]; a bucket's kind is 0
    (ignore_index, a bucket of its own), 1 (classes of the vocabulary) or 2 (refused)."""
    points = sorted({0, vocab, ignore_index, ignore_index + 1})
    firsts = [points[0] - 1, *points]  # a value of each bucket
    return points, [0 if x == ignore_index else 1 if 0 <= x < vocab else 2 for x in firsts]


@functools.lru_cache(maxsize=64)
def _tables(vocab: int, ignore_index: int, index: int) -> tuple[Any, ...]:
    """(boundaries, each bucket's "refused" flag, its mark, its counted mark) on GPU
    `index` (the CPU for -1) for :func:`refuse_on_device`: made once per vocabulary and
    device."""
    import torch

    device = torch.device("cpu") if index < 0 else torch.device("cuda", index)
    points, kinds = _classes(vocab, ignore_index)
    nan = float("nan")
    return (
        torch.tensor(points, dtype=torch.int64, device=device),
        torch.tensor([k == 2 for k in kinds], device=device),
        torch.tensor([nan if k == 2 else 0.0 for k in kinds], device=device),
        torch.tensor([nan if k == 2 else 1.0 if k else _TINY for k in kinds], device=device),
    )


# What ignore_index counts for in "mean"'s divisor: a sum of N of them is far below half
# a float32 ulp of 1 (N < 6e12), so any count of classes >= 1 comes out exact, and a
# batch that is all ignore_index divides its loss, exactly 0, by N * _TINY > 0: 0, with no
# max(1, .) op. Its gradient, the upstream gradient / (N * _TINY), stays finite (below
# 3.4e38 for upstream gradients below 3.4e18) and meets rows whose gradients are 0.
_TINY = 1e-20


def refuse_on_device(
    target: Any, vocab: int, ignore_index: int, counted: bool = False, fill: bool = True
) -> tuple[Any, Any]:
    """(`target` with each entry outside [0, vocab) that is not `ignore_index` replaced by
    `ignore_index`, float32 marks: NaN for those entries, else 0, or with `counted` 1 for
    a class and :data:`_TINY` for ignore_index): torch ops queued on the target's device,
    no value read on the host. Four small ops (a bucketize, two lookups in tables made once per
    vocabulary and device, a masked_fill): the training path pays them on every call.
    Without `fill`, `target` itself and the marks: two ops."""
    import torch

    bounds, refused, marks, counts = _tables(vocab, ignore_index, target.get_device())
    bucket = torch.bucketize(target, bounds, right=True)
    safe = target.masked_fill(refused.take(bucket), ignore_index) if fill else target
    return safe, (counts if counted else marks).take(bucket)


@functools.lru_cache(maxsize=64)
def torch_targets(vocab: int, ignore_index: int) -> tuple[int, int, int]:
    """(low, high, ignore index) for torch's cross_entropy on a target whose values were
    not read: ``target.clamp(low, high)`` with that ignore index computes every class as
    itself and ignores `ignore_index`, and turns any other value into a class or the
    ignore index, so cross_entropy's device-side assert cannot fire. One op, where
    :func:`refuse_on_device`'s fill takes two; a refused entry's NaN mark poisons the loss
    whatever it became. (The kernels take the fill: their ignore index is `ignore_index`.)"""
    if ignore_index < 0:  # every negative value: ignored as -1
        return -1, vocab - 1, -1
    if ignore_index < vocab:  # a class index that is ignored, as torch's own rule has it
        return 0, vocab - 1, ignore_index
    return 0, vocab, vocab  # every value >= vocab: ignored as vocab


class _DeviceReport:
    """One device's deferred report of refused targets. Each call leaves its refusal sum
    (a 0-dim device tensor, NaN where it refused a target) here, no op queued; every
    :data:`_EVERY_S` seconds at most (or :data:`_MOST` calls), with no copy in flight, the
    pending sums go to pinned host memory in one copy, an event after it. One buffer and
    one event per device for the whole run, not one per call."""

    __slots__ = (
        "device", "done", "host", "ignore_index", "in_flight", "last", "pending", "vocab",
    )  # fmt: skip

    def __init__(self, device: Any) -> None:
        import torch

        self.device = device
        pinned = torch.device(device).type == "cuda"  # (a CPU device: the logic's tests)
        self.host = torch.zeros(_MOST, dtype=torch.float32, pin_memory=pinned)
        self.done = torch.cuda.Event()
        self.pending: list[Any] = []
        self.in_flight = 0  # how many sums the copy in flight carries
        self.last = 0.0
        self.vocab, self.ignore_index = 0, 0

    def fold(self, refused: Any, vocab: int, ignore_index: int) -> None:
        self.pending.append(refused)
        self.vocab, self.ignore_index = vocab, ignore_index
        if not self.in_flight and (
            len(self.pending) >= _MOST or time.monotonic() - self.last >= _EVERY_S
        ):
            self._copy()

    def _copy(self) -> None:
        import torch

        sums = torch.stack(self.pending)
        if len(sums) > _MOST:  # the device ran far behind: one sum is NaN if any is
            sums = sums.sum().reshape(1)
        n = len(sums)
        self.host[:n].copy_(sums, non_blocking=True)
        # On the sums' device's stream, which need not be the current device's.
        self.done.record(torch.cuda.current_stream(self.device))
        self.pending.clear()
        self.in_flight, self.last = n, time.monotonic()

    def read(self, wait: bool) -> bool:
        """Whether the device has reported a refusal (with `wait`: every call so far, a
        device sync)."""
        import torch

        values: list[float] = []
        if self.in_flight:
            if wait:
                self.done.synchronize()
            elif not self.done.query():
                return False
            values = self.host[: self.in_flight].tolist()
            self.in_flight = 0
        if wait and self.pending:
            values += torch.stack(self.pending).tolist()
            self.pending.clear()
        refused = any(math.isnan(v) for v in values)
        if refused:
            self.pending.clear()  # one report per run of refusals
        return refused


# The report's copy rule: at most one copy per _EVERY_S seconds, or per _MOST calls.
_EVERY_S = 0.01
_MOST = 64

# The deferred reports by GPU index (GPU targets checked on the device).
_REPORTS: dict[int, _DeviceReport] = {}


def note_refusals(target: Any, refused: Any, vocab: int, ignore_index: int) -> None:
    """Fold `refused` (a 0-dim device tensor, NaN where this call refused a target: the
    marks' sum) into the device's report, read by a later call
    (:func:`raise_refused_targets`). In a graph being captured (or for a tensor subclass)
    there is no report to read later: the refusal shows as the NaN loss alone."""
    import torch

    if type(target) is not torch.Tensor or not target.is_cuda or capture_probe()():
        return
    index = target.get_device()
    report = _REPORTS.get(index)
    if report is None:
        report = _REPORTS[index] = _DeviceReport(target.device)
    report.fold(refused, vocab, ignore_index)


def raise_refused_targets(wait: bool = False) -> None:
    """Raise GretaInputError for a GPU call whose target held an entry outside the
    vocabulary (checked on the device by :func:`screen_targets`) once the device has
    reported it; with `wait`, after waiting for every such report (a device sync: tests,
    the end of a run). Every GRETA linear_cross_entropy call on a GPU runs this first."""
    for report in _REPORTS.values():
        if report.read(wait):
            raise GretaInputError(
                f"{OP}: argument 'target' of a call on {report.device} held a class outside "
                f"the vocabulary; every entry must be in [0, {report.vocab}) or equal "
                f"ignore_index ({report.ignore_index}) (checked on the device, reported "
                "after that call returned a NaN loss)"
            )


def poison(loss: Any, marks: Any | None, refused: Any | None = None) -> Any:
    """`loss` (rows, or a reduced scalar) NaN where :func:`screen_targets` refused a
    target on the device (None: nothing refused): the refused rows counted as ignored.
    `refused`: the marks' sum where the caller has it (a scalar's poison)."""
    if marks is None:
        return loss
    if loss.dim() == 0:
        return loss + (marks.sum() if refused is None else refused)
    return loss + marks


def chunk_rows(n_rows: int, vocab: int, hidden: int, scale: int = 1, floor: float = 0.0) -> int:
    """Tokens per chunk: the chunk's logits take about `scale` times the memory `hidden`
    does (a power of two, at least 1). Fewer, larger chunks make fewer passes over the
    [vocab, hidden] weight gradient (each chunk adds its share into all of it).

    With `floor` > 0 a chunk holds at least ``floor * hidden`` rows (capped at n_rows): its
    logits then take at most `floor` times the weight gradient's memory, which exists anyway.
    At few tokens the `scale` rule alone makes many thin chunks, each a full read and write of
    the weight gradient and a GEMM too thin to fill the GPU; the floor bounds their count."""
    per_row = max(1, -(-vocab // max(hidden, 1)))
    rows = max(1, min(n_rows, -(-n_rows * max(1, scale) // per_row)))
    if floor > 0:
        rows = max(rows, min(n_rows, int(floor * hidden)))
    return 1 << (rows - 1).bit_length()


def chunks(
    n_rows: int, vocab: int, hidden: int, scale: int = 1, floor: float = 0.0
) -> list[tuple[int, int]]:
    """[start, end) row ranges covering n_rows."""
    step = chunk_rows(n_rows, vocab, hidden, scale, floor)
    return [(s, min(s + step, n_rows)) for s in range(0, n_rows, step)]


def chunk_schedule(arch: str, n_rows: int, vocab: int, hidden: int) -> tuple[int, float]:
    """(CHUNK_SCALE, CHUNK_FLOOR) of the config table for this call (its rules match on
    :func:`dispatch_features`): the speed/memory trade of :func:`chunk_rows`, measured by
    bench/lce_grid.py. CHUNK_SCALE is the chunk's logits memory in units of the hidden
    states' (1: Liger-Kernel's chunk); CHUNK_FLOOR a chunk's least rows in units of the
    hidden size (0: no floor)."""
    config = configs.lookup(OP, arch, dispatch_features(n_rows, vocab, hidden))
    return int(config.get("CHUNK_SCALE", 1)), float(config.get("CHUNK_FLOOR", 0.0))


# --- which implementation runs (the config table's "linear_cross_entropy_dispatch") ------

DISPATCH = "linear_cross_entropy_dispatch"
# Table backends -> what runs. "greta": the chunked Triton kernel above. "torch": torch's
# unchunked product + cross-entropy (torch.mm, then F.cross_entropy: what
# torch.nn.functional.linear_cross_entropy with options=None is documented to be, written
# out in _torch_loss for fewer host ops, on every torch). "torch-chunked": torch's own
# chunked path (options=LinearCrossEntropyOptions(**core_options)), torch >= 2.13 only,
# reductions mean/sum only.
BACKENDS = ("greta", "torch", "torch-chunked")
# What observe records for each outcome (the "greta" backend records its kernel's own
# implementation, "triton" or "triton-interpret", when it runs).
CORE_CHUNKED = "torch-core-chunked"
LINEAR_CE = "torch-linear-ce"
# What the installed torch offers: "options" (F.linear_cross_entropy with an ``options``
# argument), "plain" (F.linear_cross_entropy without it), "none" (torch < 2.13).
CORE_APIS = ("options", "plain", "none")


def dispatch_features(n_rows: int, vocab: int, hidden: int) -> dict[str, Any]:
    """Features the dispatch rules (and the chunk schedule's) match on. N_per_H (tokens /
    hidden size) is the memory of the full [tokens, vocab] logits over the weight
    gradient's [vocab, hidden]: what an unchunked backend costs beyond a chunked one,
    relative to the gradient every backend holds. liger_rows is Liger-Kernel's chunk (the
    rows of CHUNK_SCALE 1 without a floor): how thin each pass over that gradient is."""
    return {
        "N": n_rows, "V": vocab, "H": hidden, "N_per_H": n_rows / max(hidden, 1),
        "liger_rows": chunk_rows(n_rows, vocab, hidden),
    }  # fmt: skip


def dispatch_config(arch: str, n_rows: int, vocab: int, hidden: int) -> dict[str, Any]:
    """The table's dispatch entry for this call (backend, core_options)."""
    return configs.lookup(DISPATCH, arch, dispatch_features(n_rows, vocab, hidden))


def choose(arch: str, n_rows: int, vocab: int, hidden: int, reduction: str, core_api: str) -> str:
    """What runs this call: "greta" (the chunked kernel), LINEAR_CE or CORE_CHUNKED. A pure
    function of the call's shape, the arch's table and what torch offers: where the table
    asks for a chunked path this torch lacks (no core options), or for reduction "none",
    GRETA's own runs."""
    if core_api not in CORE_APIS:
        raise GretaInputError(f"core_api {core_api!r}; expected one of {', '.join(CORE_APIS)}")
    backend = dispatch_config(arch, n_rows, vocab, hidden).get("backend", "greta")
    if backend not in BACKENDS:
        raise ConfigError(
            f"config table for {arch}: {DISPATCH} backend {backend!r}; expected one of "
            f"{', '.join(BACKENDS)}"
        )
    if backend == "torch":
        return LINEAR_CE
    if backend == "torch-chunked" and core_api == "options" and reduction != "none":
        return CORE_CHUNKED
    return "greta"


@memo
def plan_rows(
    n_rows: int, n_cols: int, stride: int, dtype: str, ignore_index: int,
    write_grad: bool, row_scale: bool, arch: str,
) -> Plan:  # fmt: skip
    """Inputs (target [rows] int64, scale fp32 [1] or [rows], logits [rows, V]); buffers:
    loss fp32 [rows], the logits updated in place to dlogits (when write_grad)."""
    config = configs.lookup(OP, arch, {"V": n_cols})
    launch = Launch(
        cross_entropy_rows_kernel, grid(n_rows),
        (In(0), In(1), In(2), n_cols, stride, ignore_index, Out(0), Out(1)),
        {"BLOCK_V": config["BLOCK_V"], "WRITE_GRAD": write_grad, "ROW_SCALE": row_scale},
        configs.launch_options(config, arch),
    )  # fmt: skip
    buffers = (Buffer((n_rows,), "float32"), Buffer((n_rows, n_cols), dtype, alias=2))
    return Plan(OP, arch, buffers, (launch,) if n_rows else (), (0, 1))


@memo
def plan_scale(n: int, dtype: str, arch: str) -> Plan:
    """Inputs x [n] (contiguous, scaled in place) and scale fp32 [1]; buffer: x itself."""
    config = configs.lookup(OP, arch, {})
    block = config["BLOCK_V"]  # the rows kernel's block: a flat run of elements either way
    launch = Launch(
        scale_in_place_kernel, scale_grid(n, block), (In(0), In(1), n, Out(0)),
        {"BLOCK": block}, configs.launch_options(config, arch),
    )  # fmt: skip
    return Plan(OP, arch, (Buffer((n,), dtype, alias=0),), (launch,) if n else (), (0,))


def scale_in_place(x: Any, scale: Any) -> Any:
    """``x *= scale`` for a GPU gradient and a device scalar, without a pass over x where
    scale is exactly 1 (``kernels/linear_cross_entropy.scale_in_place_kernel``) and without
    a host sync on its value. H200, bf16 [128256, 2048]: 0.02 ms at 1 and 0.26 ms
    otherwise, against mul_'s 0.66 ms by a 0-dim CUDA tensor (a broadcast operand: no
    vectorised loads)."""
    import torch

    if not x.is_contiguous():
        return x.mul_(scale.to(x.dtype))
    flat = x.view(-1)
    s = scale.reshape(1).to(torch.float32)
    plan = plan_scale(flat.numel(), dtype_name(x.dtype), arch_for(OP, x, False))
    run(plan, (flat, s), out=(flat,))
    # As mul_ would, whatever the value: a second backward through a retained graph that
    # saved x then fails autograd's version check instead of reading a scaled gradient.
    torch.autograd.graph.increment_version(x)
    return x


# --- the raw API (torch tensors; the torch ops call these with wrap=wrap_triton) ----------


def _chunked(
    hidden: Any, weight: Any, target: Any, ignore_index: int, scale: Any,
    write_grad: bool, row_scale: bool, arch: str, wrap: Wrap, dh_into_hidden: bool = False,
) -> tuple[Any, Any, Any]:  # fmt: skip
    """(loss rows fp32 [N], dhidden or None, dweight or None); with `dh_into_hidden`
    dhidden is `hidden` itself, overwritten chunk by chunk."""
    import torch

    n_rows, vocab = hidden.shape[0], weight.shape[0]
    loss = torch.empty(n_rows, dtype=torch.float32, device=hidden.device)
    dh = (hidden if dh_into_hidden else torch.empty_like(hidden)) if write_grad else None
    width = hidden.shape[1]
    spans = chunks(n_rows, vocab, width, *chunk_schedule(arch, n_rows, vocab, width))
    # The first chunk writes dweight (beta=0 reads none of it), the others add into it: no
    # zero-fill and no read of a zero gradient, each a full pass over [vocab, hidden].
    dw = (torch.empty_like if spans else torch.zeros_like)(weight) if write_grad else None
    for start, end in spans:
        h = hidden[start:end]
        logits = torch.mm(h, weight.t())
        plan = plan_rows(
            end - start, vocab, logits.stride(0), dtype_name(logits.dtype), int(ignore_index),
            write_grad, row_scale, arch,
        )  # fmt: skip
        s = scale[start:end] if row_scale else scale
        run(plan, (target[start:end], s, logits), out=(loss[start:end], logits), wrap=wrap)
        if write_grad:
            # dweight's share reads the chunk's hidden rows before its dhidden rows are
            # written: with dh_into_hidden they are the same memory. torch.mm(out=) (not a
            # raw kernel write) moves hidden's version counter, so a backward that saved
            # hidden raises instead of reading dhidden.
            dw.addmm_(logits.t(), h, beta=1 if start else 0)
            torch.mm(logits, weight, out=dh[start:end])
        # Freed before the next chunk's logits exist: one chunk alive at a time, not two.
        del logits
    return loss, dh, dw


def mean_scale(target: Any, ignore_index: int) -> Any:
    """fp32 [1]: 1 / max(1, number of non-ignored targets), computed on the device."""
    import torch

    n_valid = (target != ignore_index).sum().clamp(min=1)
    return (1.0 / n_valid.to(torch.float32)).reshape(1)


def check_dh_into_hidden(hidden: Any, with_grad: bool, reduction: str) -> None:
    """dhidden can go over `hidden` only when the forward computes it (with_grad, reduction
    mean or sum) and `hidden` is contiguous as given (its rows are dhidden's rows)."""
    if not (with_grad and reduction != "none" and hidden.is_contiguous()):
        raise GretaInputError(
            f"{OP}: dh_into_hidden=True needs with_grad=True, reduction 'mean' or 'sum' "
            f"and a contiguous 'hidden' (got with_grad={with_grad}, reduction={reduction!r}, "
            f"contiguous={hidden.is_contiguous()})"
        )


def linear_cross_entropy_fwd(
    hidden: Any, weight: Any, target: Any, ignore_index: int = -100,
    reduction: str = "mean", with_grad: bool = False, wrap: Wrap = _no_wrap,
    *, dh_into_hidden: bool = False,
) -> tuple[Any, Any | None, Any | None]:  # fmt: skip
    """(loss, dhidden, dweight): the gradients of the loss itself (None without with_grad;
    reduction="none" takes :func:`linear_cross_entropy_bwd` instead).

    With ``dh_into_hidden=True`` dhidden is written over `hidden`'s memory and the returned
    dhidden *is* `hidden`: one [tokens, hidden] tensor less at the forward's peak. Only for
    a caller that owns `hidden` (nothing reads its values afterwards); it needs with_grad,
    reduction "mean" or "sum" and a contiguous `hidden`.

    Raises GretaInputError for a wrong shape, dtype, device or layout.
    """
    arch = _validate_fwd(hidden, weight, target, ignore_index, reduction, with_grad, dh_into_hidden)
    return _forward(
        arch, hidden, weight, target, ignore_index, reduction, with_grad, wrap, dh_into_hidden
    )


def _forward(
    arch: str, hidden: Any, weight: Any, target: Any, ignore_index: int, reduction: str,
    with_grad: bool, wrap: Wrap, dh_into_hidden: bool,
) -> tuple[Any, Any | None, Any | None]:  # fmt: skip
    """:func:`linear_cross_entropy_fwd` after validation."""
    import torch

    target, marks, refused = screen_targets(target, weight.shape[0], ignore_index)
    hidden, weight = hidden.contiguous(), weight.contiguous()
    write_grad = with_grad and reduction != "none"
    if reduction == "mean":
        scale = mean_scale(target, ignore_index)
    else:
        scale = torch.ones(1, dtype=torch.float32, device=hidden.device)
    loss, dh, dw = _chunked(
        hidden, weight, target, ignore_index, scale, write_grad, False, arch, wrap, dh_into_hidden
    )
    if reduction == "none":
        loss = poison(loss, marks)
    elif reduction == "sum":
        loss = poison(loss.sum(), marks, refused)
    else:
        loss = poison(loss.sum() * scale[0], marks, refused)
    return loss, dh, dw


def linear_cross_entropy(
    hidden: Any, weight: Any, target: Any, ignore_index: int = -100, reduction: str = "mean"
) -> Any:
    """Cross-entropy of ``hidden @ weight.T`` against `target` (rows equal to
    `ignore_index` count for nothing), chunked so the logits never exist. No autograd
    (see torch.ops.greta.linear_cross_entropy).

    Raises GretaInputError for a wrong shape, dtype, device or layout.
    """
    return linear_cross_entropy_fwd(hidden, weight, target, ignore_index, reduction)[0]


# --- the backward's kernel op, declared (greta::linear_cross_entropy_bwd, raw, JAX) -------


def _validate_bwd(
    hidden: Any, weight: Any, target: Any, row_scale: Any, ignore_index: int,
    reference: bool = False,
) -> str:  # fmt: skip
    import torch

    arch = validate(hidden, weight, target, "none", reference)
    scales = (torch.float32, torch.float64) if reference else (torch.float32,)
    check_tensor(OP, "row_scale", row_scale, dtypes=scales, ndim=1, contiguous=True)
    if row_scale.shape[0] != hidden.shape[0]:
        raise GretaInputError(
            f"{OP}: argument 'row_scale' has {row_scale.shape[0]} entries; expected "
            f"{hidden.shape[0]}"
        )
    return arch


def _bwd_body(
    arch: str, hidden: Any, weight: Any, target: Any, row_scale: Any, ignore_index: int,
    *, wrap: Wrap, stats: bool,
) -> tuple[Any, Any]:  # fmt: skip
    target = check_targets(target, weight.shape[0], ignore_index)
    hidden, weight = hidden.contiguous(), weight.contiguous()
    _, dh, dw = _chunked(hidden, weight, target, ignore_index, row_scale, True, True, arch, wrap)
    return dh, dw


def _bwd_reference(
    hidden: Any, weight: Any, target: Any, row_scale: Any, ignore_index: int
) -> tuple[Any, Any]:
    from greta_core import reference

    target = check_targets(target, weight.shape[0], ignore_index)
    return reference.linear_cross_entropy_bwd(hidden, weight, target, row_scale, ignore_index)


# --- the JAX bodies: the same chunks, jnp.dot for the GEMMs ----------------------------


def _jax_precision(dtype: Any) -> str | None:
    """The chunk GEMMs' precision: float32 in full fp32, as F.linear with torch's defaults
    (JAX's default would take TF32 on an NVIDIA GPU), unless the user chose a default
    (jax_default_matmul_precision); half types take the tensor cores either way."""
    import jax
    import jax.numpy as jnp

    if dtype == jnp.float32 and jax.config.jax_default_matmul_precision is None:
        return "highest"
    return None


def jax_rows(
    run: Callable[..., Any], logits: Any, target: Any, scale: Any, ignore_index: int,
    write_grad: bool,
) -> tuple[Any, Any]:  # fmt: skip
    """(loss fp32 [rows], dlogits * scale[:, None] or None) of one chunk on JAX arrays:
    the kernel through `run` (``OpDecl.jax_body``), else jax.numpy."""
    import jax.numpy as jnp

    from greta_core import reference
    from greta_core.observe import record

    rows, vocab = logits.shape
    done = run(
        lambda arch: plan_rows(
            rows, vocab, vocab, str(logits.dtype), int(ignore_index), write_grad, True, arch
        ),
        (target, scale, logits),
    )
    if done is not None:
        loss, grad = done
        return loss, grad if write_grad else None
    record(OP, "reference-jnp")
    loss, grad = reference.cross_entropy_rows(logits, target, ignore_index)
    if not write_grad:
        return loss, None
    return loss, (grad * scale.astype(jnp.float32)[:, None]).astype(logits.dtype)


def _jax_bwd_body(
    run: Callable[..., Any], hidden: Any, weight: Any, target: Any, row_scale: Any,
    ignore_index: int, *, stats: bool,
) -> tuple[Any, Any]:  # fmt: skip
    import jax.numpy as jnp

    n, h = hidden.shape
    dh = []
    dw = jnp.zeros(weight.shape, jnp.float32)
    prec = _jax_precision(hidden.dtype)
    for s, e in chunks(n, weight.shape[0], h):
        hc = hidden[s:e]
        logits = jnp.dot(hc, weight.T, precision=prec).astype(hidden.dtype)
        _, g = jax_rows(run, logits, target[s:e], row_scale[s:e], ignore_index, True)
        dh.append(jnp.dot(g, weight, precision=prec).astype(hidden.dtype))
        dw = dw + jnp.dot(g.T, hc, precision=prec, preferred_element_type=jnp.float32)
    return jnp.concatenate(dh) if dh else jnp.zeros_like(hidden), dw.astype(weight.dtype)


LINEAR_CROSS_ENTROPY_BWD = declare(OpDecl(
    name="linear_cross_entropy_bwd",
    schema=(
        "Tensor hidden, Tensor weight, Tensor target, Tensor row_scale, int ignore_index "
        "-> (Tensor, Tensor)"
    ),
    describe="(dhidden, dweight) of linear_cross_entropy for per-row gradients row_scale",
    validate=_validate_bwd,
    plan=None,
    body=_bwd_body,
    jax_body=_jax_bwd_body,
    reference=_bwd_reference,
    front=False,
    uses_matrix_units=True,
))  # fmt: skip


def linear_cross_entropy_bwd(
    hidden: Any, weight: Any, target: Any, row_scale: Any, ignore_index: int = -100,
    wrap: Wrap = _no_wrap,
) -> tuple[Any, Any]:  # fmt: skip
    """(dhidden, dweight) for per-row upstream gradients `row_scale` (fp32 [N]).

    Raises GretaInputError for a wrong shape, dtype, device or layout.
    """
    return LINEAR_CROSS_ENTROPY_BWD.raw(hidden, weight, target, row_scale, ignore_index, wrap=wrap)


# --- the forward's kernel op, declared (greta::linear_cross_entropy_fwd) ------------------
# Its flags `with_grad` (the forward computes the gradients, a backward follows) and
# `dh_into_hidden` (dhidden goes over `hidden`) are chosen per call by the public op
# (declare.Front: _flags below, from what the binding tells of the call).


def _empty(t: Any) -> Any:
    return t.new_empty(0)


def _validate_fwd(
    hidden: Any, weight: Any, target: Any, ignore_index: int, reduction: str, with_grad: bool,
    dh_into_hidden: bool, reference: bool = False,
) -> str:  # fmt: skip
    arch = validate(hidden, weight, target, reduction, reference)
    if dh_into_hidden:
        check_dh_into_hidden(hidden, with_grad, reduction)
    return arch


# dh_into_hidden=True: dhidden is written over the input `hidden` and the op's dhidden
# output is a 0-element placeholder. A custom op's outputs may not alias its inputs (torch
# checks it at runtime), so `hidden` itself cannot be returned; the backward saves the input
# `hidden` in dhidden's place instead (_saves).
def _fwd_body(
    arch: str, hidden: Any, weight: Any, target: Any, ignore_index: int, reduction: str,
    with_grad: bool, dh_into_hidden: bool, *, wrap: Wrap, stats: bool,
) -> tuple[Any, Any, Any]:  # fmt: skip
    loss, dh, dw = _forward(
        arch, hidden, weight, target, ignore_index, reduction, with_grad, wrap, dh_into_hidden
    )
    keep_dh = dh is not None and not dh_into_hidden
    return loss, dh if keep_dh else _empty(hidden), _empty(weight) if dw is None else dw


def _fwd_reference(
    hidden: Any, weight: Any, target: Any, ignore_index: int, reduction: str, with_grad: bool,
    dh_into_hidden: bool,
) -> tuple[Any, Any, Any]:  # fmt: skip
    import torch

    from greta_core import reference
    from greta_core.observe import record

    target, marks, refused = screen_targets(target, weight.shape[0], ignore_index)
    record(OP, "reference-torch", "cpu")
    loss = reference.linear_cross_entropy(hidden, weight, target, ignore_index, reduction)
    loss = poison(loss, marks, refused)
    if not with_grad or reduction == "none":
        return loss, _empty(hidden), _empty(weight)
    ct = reference.compute_dtype(hidden)
    scale = torch.ones(hidden.shape[0], dtype=ct, device=hidden.device)
    if reduction == "mean":
        scale = scale / (target != ignore_index).sum().clamp(min=1)
    dh, dw = reference.linear_cross_entropy_bwd(hidden, weight, target, scale, ignore_index)
    if dh_into_hidden:  # nothing saved here: the contract is kept for every path alike
        hidden.copy_(dh)
        dh = _empty(hidden)
    return loss.to(ct), dh, dw


def _precomputed(with_grad: bool, reduction: str) -> bool:
    """The forward computed the gradients (the backward only scales them)."""
    return with_grad and reduction != "none"


def _saves(
    hidden: Any, weight: Any, target: Any, ignore_index: int, reduction: str, with_grad: bool,
    dh_into_hidden: bool,
) -> tuple[str, ...]:  # fmt: skip
    if _precomputed(with_grad, reduction):
        return ("hidden" if dh_into_hidden else "out1", "out2")
    return ("hidden", "weight", "target")


def _scales_in_place(dloss: Any, dh: Any) -> bool:
    """The gradients are scaled in place: a plain concrete GPU tensor in a kernel dtype
    (the Triton path). No second dweight ([vocab, hidden]) at the train step's peak and no
    host sync on dloss's value; a second backward through a retained graph then fails
    autograd's version check instead of scaling twice. Elsewhere (CPU, meta, float64
    references, tracing, and a dloss that requires grad: a backward with create_graph, whose
    gradients must stay functions of dloss) a plain product."""
    import torch

    return (
        type(dloss) is torch.Tensor
        and not dloss.requires_grad
        and not torch.compiler.is_compiling()
        and not torch._C._len_torch_dispatch_stack()
        and dh.device.type == "cuda"
        and dh.dtype in (torch.float32, torch.float16, torch.bfloat16)
    )


def _torch_row_scale(
    dloss: Any, hidden: Any, target: Any, ignore_index: int, reduction: str
) -> Any:
    """Per-row upstream gradients of the loss, as linear_cross_entropy_bwd takes them."""
    import torch

    if reduction == "none":
        row_scale = dloss.to(torch.float32).contiguous()
    else:
        ones = torch.ones(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        row_scale = ones * dloss.to(torch.float32)
        if reduction == "mean":
            row_scale = row_scale * mean_scale(target, ignore_index)
    return row_scale.to(torch.float64) if hidden.dtype == torch.float64 else row_scale


def _jax_row_scale(dloss: Any, hidden: Any, target: Any, ignore_index: int, reduction: str) -> Any:
    import jax.numpy as jnp

    row_scale = jnp.broadcast_to(dloss.astype(jnp.float32), (hidden.shape[0],))
    if reduction == "mean":
        row_scale = row_scale / _jax_n_valid(target, ignore_index)
    return row_scale


def _fwd_grads(call: Any, grad_outputs: tuple[Any, ...], saved: Any) -> tuple[Any, ...]:
    dloss = grad_outputs[0]
    rest = (None,) * 5
    if dloss is None:  # only the non-differentiable outputs were used
        return (None, None, *rest)
    if _precomputed(saved.with_grad, saved.reduction):  # torch only
        # With dh_into_hidden the saved dhidden is the input `hidden`, graph and all: a
        # detached alias (same memory and version counter) is a plain gradient like dw.
        dh = (saved.hidden if saved.dh_into_hidden else saved.out1).detach()
        dw = saved.out2.detach()
        if _scales_in_place(dloss, dh):
            return scale_in_place(dh, dloss), scale_in_place(dw, dloss), *rest
        return dh * dloss.to(dh.dtype), dw * dloss.to(dw.dtype), *rest
    hidden = saved.hidden
    if type(hidden).__module__.partition(".")[0] == "torch":
        row_scale = _torch_row_scale(
            dloss, hidden, saved.target, saved.ignore_index, saved.reduction
        )
    else:  # JAX (its forward never computes the gradients)
        row_scale = _jax_row_scale(dloss, hidden, saved.target, saved.ignore_index, saved.reduction)
    dh, dw = call(
        LINEAR_CROSS_ENTROPY_BWD, hidden, saved.weight, saved.target, row_scale,
        saved.ignore_index,
    )  # fmt: skip
    return dh, dw, *rest


def _jax_fwd_body(
    run: Callable[..., Any], hidden: Any, weight: Any, target: Any, ignore_index: int,
    reduction: str, with_grad: bool, dh_into_hidden: bool, *, stats: bool,
) -> tuple[Any, Any, Any]:  # fmt: skip
    """The loss alone (JAX's backward redoes the chunks through the declared backward op)."""
    import jax.numpy as jnp

    n, h = hidden.shape
    rows = []
    ones = jnp.ones((n,), jnp.float32)
    prec = _jax_precision(hidden.dtype)
    for s, e in chunks(n, weight.shape[0], h):
        logits = jnp.dot(hidden[s:e], weight.T, precision=prec).astype(hidden.dtype)
        rows.append(jax_rows(run, logits, target[s:e], ones[s:e], ignore_index, False)[0])
    loss = jnp.concatenate(rows) if rows else jnp.zeros((0,), jnp.float32)
    if reduction != "none":
        loss = jnp.sum(loss)
        if reduction == "mean":
            loss = loss / _jax_n_valid(target, ignore_index)
    empty = jnp.zeros((0,), hidden.dtype)
    return loss, empty, empty


def _jax_n_valid(target: Any, ignore_index: int) -> Any:
    import jax.numpy as jnp

    return jnp.maximum(jnp.sum(target != ignore_index), 1).astype(jnp.float32)


def _check_arrays_fwd(
    hidden: Any, weight: Any, target: Any, ignore_index: int, reduction: str, *flags: bool
) -> None:
    """JAX arrays' checks (the torch binding's are `validate`)."""
    check_array_float(OP, "hidden", hidden)
    check_array_float(OP, "weight", weight)
    if hidden.ndim != 2 or weight.ndim != 2 or weight.shape[1] != hidden.shape[1]:
        raise GretaInputError(
            f"{OP}: arguments 'hidden' {hidden.shape} and 'weight' {weight.shape} must be "
            "[N, H] and [V, H]"
        )
    if weight.dtype != hidden.dtype:
        raise GretaInputError(f"{OP}: 'weight' dtype {weight.dtype} differs from 'hidden's")
    if target.shape != (hidden.shape[0],) or "int" not in str(target.dtype):
        raise GretaInputError(
            f"{OP}: argument 'target' must be an int array of shape ({hidden.shape[0]},), "
            f"got {target.shape} {target.dtype}"
        )
    if reduction not in REDUCTIONS:
        raise GretaInputError(f"{OP}: reduction {reduction!r} not in {', '.join(REDUCTIONS)}")


def _check_target_values(hidden: Any, weight: Any, target: Any, ignore_index: int, *_: Any) -> None:
    """`OpDecl.check_values`: targets whose values are on the host (the torch CPU kernel,
    concrete JAX arrays; torch GPU tensors are checked on the device by the body)."""
    if type(target).__module__.partition(".")[0] == "torch":
        check_targets(target, weight.shape[0], ignore_index)
        return
    import numpy as np

    if target.size:
        refuse_on_host(np.asarray(target), int(weight.shape[0]), ignore_index)


# --- the public op: greta::linear_cross_entropy (declare.Front) ----------------------------
# Per call it reads the config table's dispatch (torch's own code may run instead) and
# decides the kernel op's flags: `with_grad` where a backward follows (the forward then
# computes the gradients), `dh_into_hidden` inside consume_inputs() (the forward's peak
# then holds one [tokens, hidden] tensor less).


def _flags(
    context: Any, hidden: Any, weight: Any, target: Any, ignore_index: int, reduction: str
) -> tuple[bool, bool]:
    """(with_grad, dh_into_hidden). dhidden goes over `hidden` only where the forward
    computes it, on the kernels' path (elsewhere nothing fresh is saved: the references
    compute in their own tensors), for a `hidden` contiguous as given (else the kernel's
    .contiguous() copy is fresh anyway) that the caller lets the op overwrite."""
    with_grad = reduction != "none" and context.backward_follows(hidden, weight)
    into_hidden = (
        with_grad
        and hidden.is_contiguous()
        and context.owned(hidden)
        and context.kernel_runs(hidden, weight)
    )
    return with_grad, into_hidden


@functools.cache
def core_api() -> str:
    """What this torch offers for the dispatch (:data:`CORE_APIS`)."""
    import inspect

    import torch

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
    import torch

    for module in (torch.nn, torch.nn.functional):
        cls = getattr(module, "LinearCrossEntropyOptions", None)
        if cls is not None:
            return cls
    return None


def core_options(arch: str, n_rows: int, vocab: int, hidden: int) -> Any:
    """LinearCrossEntropyOptions from the table's ``core_options`` (fields this torch's
    options class lacks are left out: the class changed between torch releases)."""
    import dataclasses

    cls = core_options_class()
    wanted = dispatch_config(arch, n_rows, vocab, hidden).get("core_options", {})
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    return cls(**{k: v for k, v in wanted.items() if k in fields})


# --- the delegated path: torch's own loss, GRETA's target screening ---------------------

SCREEN = "linear_cross_entropy_targets"


@memo
def plan_screen(n: int, vocab: int, ignore_index: int, reduction: str, arch: str) -> Plan:
    """Input target int64 [n]; buffers: the safe target int64 [n], the total fp32 [] and,
    for reduction "none", the marks fp32 [n] (see ``kernels/lce_targets.py``). One program:
    the delegated regime has few tokens, and its sum is the same for any schedule."""
    from greta_core.kernels.lce_targets import MODES, screen_targets_kernel

    count, marks = MODES[reduction]
    config = configs.lookup(SCREEN, arch, {})
    launch = Launch(
        screen_targets_kernel, (1,),
        (In(0), n, vocab, ignore_index, Out(0), Out(1), Out(2 if marks else 1)),
        {"COUNT": count, "MARKS": marks, "BLOCK": config["BLOCK"]},
        configs.launch_options(config, arch),
    )  # fmt: skip
    buffers = (Buffer((n,), "int64"), Buffer((), "float32"))
    if marks:
        buffers += (Buffer((n,), "float32"),)
    return Plan(SCREEN, arch, buffers, (launch,), tuple(range(len(buffers))))


def _resolve_screen(target: Any, vocab: int, ignore_index: int, reduction: str, arch: str) -> Plan:
    return plan_screen(target.shape[0], vocab, ignore_index, reduction, arch)


# The screening's call cache: validation happened where the route was decided (_how), so
# its resolve only plans; its ready launch serves the calls after the first of a signature.
_SCREEN_CALL = ForwardCall(_resolve_screen, 1, *tensors_as_given(1))


@memo
def plan_poison(n: int, vocab: int, ignore_index: int, reduction: str, arch: str) -> Plan:
    """Inputs target int64 [n] and float32 logits [n, vocab] (contiguous, written in place);
    buffers: the safe target int64 [n] and the total fp32 [] (``kernels/lce_targets.py``,
    ``poison_logits_kernel``). One program, as :func:`plan_screen`."""
    from greta_core.kernels.lce_targets import poison_logits_kernel

    config = configs.lookup(SCREEN, arch, {})
    launch = Launch(
        poison_logits_kernel, (1,),
        (In(0), n, vocab, ignore_index, In(1), Out(0), Out(1)),
        {"MEAN": reduction == "mean", "BLOCK": config["BLOCK"]},
        configs.launch_options(config, arch),
    )  # fmt: skip
    return Plan(SCREEN, arch, (Buffer((n,), "int64"), Buffer((), "float32")), (launch,), (0, 1))


def _resolve_poison(
    target: Any, logits: Any, vocab: int, ignore_index: int, reduction: str, arch: str
) -> Plan:
    return plan_poison(target.shape[0], vocab, ignore_index, reduction, arch)


_POISON_CALL = ForwardCall(_resolve_poison, 2, *tensors_as_given(2))


class _Delegated:
    """What one delegated call signature needs, decided once (:func:`_how`): what runs, the
    bounds of :func:`torch_targets` (for targets the kernel does not screen), torch's
    chunked options and the screening kernel's arguments."""

    __slots__ = (
        "arch", "capturing", "device", "functorch", "high", "ignore", "ignore_index", "impl",
        "low", "mean", "none", "options", "poisons", "reduction", "screen", "screened",
        "vocab",
    )  # fmt: skip

    def __init__(
        self, impl: str, arch: str, hidden: Any, weight: Any, target: Any, ignore_index: int,
        reduction: str,
    ) -> None:  # fmt: skip
        import torch

        n_rows, vocab = hidden.shape[0], weight.shape[0]
        self.impl, self.arch, self.vocab, self.ignore_index = impl, arch, vocab, ignore_index
        self.low, self.high, self.ignore = torch_targets(vocab, ignore_index)
        self.reduction, self.mean, self.none = reduction, reduction == "mean", reduction == "none"
        self.options = (
            core_options(arch, n_rows, vocab, hidden.shape[1]) if impl == CORE_CHUNKED else None
        )
        self.device = target.get_device()  # -1: the CPU (Triton's interpreter)
        # An empty target has nothing to screen (nor launch for). The table's KERNEL says
        # whether the kernel screens at all (false: screen_targets' torch ops screen it).
        self.screened = n_rows > 0 and bool(configs.lookup(SCREEN, arch, {}).get("KERNEL"))
        self.screen = (vocab, ignore_index, reduction, arch)  # _SCREEN_CALL's scalars
        # poison_logits_kernel's class (0, or 1 where ignore_index is 0) is in the vocabulary.
        self.poisons = self.screened and vocab > (ignore_index == 0)
        self.capturing = capture_probe()
        # A functorch transform is active: its wrapped tensors have no data to launch on.
        self.functorch = getattr(torch._C, "_are_functorch_transforms_active", bool)


# What _route decided per call signature (and table: keyed on configs.lookup, an Override
# too, as memo is, and on core_api()): None for the kernel op, else a _Delegated.
# A delegated signature is validated once, when it enters: everything `validate` reads of
# the tensors is in the key (their values are the screening's business).
_ROUTES: dict[tuple[Any, ...], _Delegated | None] = {}
_MAX_ROUTES = 1024


def _route(
    context: Any, hidden: Any, weight: Any, target: Any, ignore_index: int, reduction: str
) -> Any:
    """torch's own loss where the table picks it for this call, else None (the kernel op).
    Only a call that GRETA's kernel would run is dispatched: the CPU and float64
    references stay as they are, and a malformed call reaches the kernel's validation.

    One lookup per call: the key holds everything the decision reads (shapes, dtypes,
    devices, the table), so a hit runs torch's loss at once. Whether the kernels run on
    the CPU follows the environment (TRITON_INTERPRET, GRETA_TRITON_ON_CPU): asked per
    call there, never cached."""
    # get_device(): an int (-1 on the CPU), cheaper than building a torch.device.
    try:
        key = (
            hidden.shape, hidden.dtype, hidden.get_device(), weight.shape, weight.dtype,
            weight.get_device(), target.shape, target.dtype, target.get_device(),
            target.is_contiguous(), reduction, ignore_index, configs.lookup, core_api(),
        )  # fmt: skip
        how = _ROUTES[key]
    except KeyError:
        how = _how(context, hidden, weight, target, ignore_index, reduction)
        if how is not _ASK and len(_ROUTES) < _MAX_ROUTES:
            _ROUTES[key] = how
    except TypeError:
        # An unhashable (symbolic) size: traced with dynamic shapes (torch.compile, opcheck's
        # aot_dispatch_dynamic). The kernel op, a triton_op, traces as itself; the delegated
        # path's tables are per concrete size.
        return None
    if how is None or how is _ASK:
        return None
    if how.device < 0 and not context.kernel_runs(hidden, weight):
        return None
    return _torch_loss(how, hidden, weight, target)


# _how's answer for a call whose decision must not be cached: the CPU's kernels declined
# it (the environment may allow them later).
_ASK: Any = object()


def _how(
    context: Any, hidden: Any, weight: Any, target: Any, ignore_index: int, reduction: str
) -> _Delegated | None:
    """:func:`_route`'s decision for a new call signature."""
    from greta_core.arch import arch_of

    if hidden.dim() != 2 or weight.dim() != 2:
        return None
    if not context.kernel_runs(hidden, weight):
        return _ASK if hidden.get_device() < 0 else None
    arch = arch_of(hidden)
    n_rows, vocab, size = hidden.shape[0], weight.shape[0], hidden.shape[1]
    impl = choose(arch, n_rows, vocab, size, reduction, core_api())
    if impl == "greta":
        return None
    validate(hidden, weight, target, reduction)
    return _Delegated(impl, arch, hidden, weight, target, ignore_index, reduction)


def _screened(how: _Delegated, target: Any) -> tuple[Any, int, Any, Any]:
    """:func:`_torch_loss`'s target where the screening kernel does not take it (values on
    the host, traced, meta, empty, a tensor subclass, a functorch transform): (the target
    torch's loss reads, its ignore index, the call's total, the marks) from
    :func:`screen_targets` and :func:`torch_targets`' clamp."""
    target, marks, total = screen_targets(target, how.vocab, how.ignore_index, how.mean, False)
    return target.clamp(how.low, how.high), how.ignore, total, marks


def _launch_screen(how: _Delegated, target: Any) -> tuple[Any, ...]:
    """The screening kernel's results for `target`: the screening's call cache, whose
    ready launch serves every call after the first of a signature (the ordinary path
    under the interpreter, another alignment or another current device)."""
    return _SCREEN_CALL.launch((target, *how.screen))


def _launch_poison(how: _Delegated, target: Any, logits: Any) -> tuple[Any, ...]:
    """(the safe target, the total) of ``poison_logits_kernel`` on float32 `logits`, which
    it writes in place: its call cache, as :func:`_launch_screen`'s."""
    return _POISON_CALL.launch((target, logits, *how.screen))


def _torch_loss(how: _Delegated, hidden: Any, weight: Any, target: Any) -> Any:
    """The loss by torch's own code; the inputs are checked as GRETA's kernel checks them
    (same one-line errors whichever implementation the table picks). The loss is float32
    and summed in float32, as the kernel's: torch's own sum or mean of bf16 losses rounds
    the total to bf16 (8 bits). "mean" divides that sum by max(1, non-ignored targets),
    the kernel's rule: a batch whose targets are all ignored gives 0 (torch's own mean
    gives NaN), whichever implementation ran.

    A host-bound training step pays every op here twice (forward and backward), so there
    are few. Float32 logits of a plain tensor whose values are on the device (the
    host-bound regime: :data:`_UPCAST_MAX`) take torch's own ops and nothing else: torch's
    product, ``.float()`` and cross_entropy with the call's reduction, with one launch of
    the screening between the last two, which writes the refusals and "mean"'s empty
    count into the logits (``poison_logits_kernel``). Elsewhere the screening runs first
    and the reduction follows: "mean" divides by its total, "sum" adds the total, "none"
    the marks (NaN where a target was refused). The unchunked path is
    F.linear_cross_entropy with options=None as torch documents it (F.linear, then
    F.cross_entropy), written out: a 2-D product needs none of F.linear's reshapes, and
    logits of at most :data:`_UPCAST_MAX` elements go to cross_entropy in float32, as the
    kernel computes them, which sums in float32 inside cross_entropy's own reduction."""
    import torch

    F = torch.nn.functional
    impl = how.impl
    if recorded.get(OP) != impl and not torch.compiler.is_compiling():
        record(OP, impl, how.arch)
    # A plain tensor whose values are on the device: the screening kernel
    # (kernels/lce_targets.py), one launch whose total (NaN if any entry was refused) goes
    # to the device's deferred report. Inline: the training path's hottest lines.
    on_device = (
        type(target) is torch.Tensor
        and how.screened
        and not torch._is_functional_tensor(target)
        and (how.device >= 0 or not _values_on_host(target))
        and not how.functorch()
    )
    logits = None
    if impl != CORE_CHUNKED:
        logits = torch.mm(hidden, weight.t())
        if logits.numel() <= _UPCAST_MAX:
            logits = logits.float()
        # Written in place: a fresh tensor nothing else holds (neither the product's nor
        # the copy's backward saves it), and plain (a subclass's data is not its own).
        if (
            on_device
            and how.poisons
            and logits.dtype == torch.float32
            and type(logits) is torch.Tensor
        ):
            raise_refused_targets()
            safe, total = _launch_poison(how, target, logits)
            _fold(how, total, target)
            return F.cross_entropy(logits, safe, ignore_index=how.ignore_index,
                                   reduction=how.reduction)  # fmt: skip
    if on_device:
        # The safe target (a refused entry as ignore_index, which torch's loss then
        # ignores), the total ("mean": max(1, the count of classes), else 0; NaN if any
        # entry was refused) and for "none" the per-row marks.
        raise_refused_targets()
        outs = _launch_screen(how, target)
        safe, ignore, total = outs[0], how.ignore_index, outs[1]
        marks = outs[2] if how.none else None
        _fold(how, total, target)
    else:
        safe, ignore, total, marks = _screened(how, target)
    if logits is None:  # CORE_CHUNKED: its chunked path takes "sum" or "mean" only
        loss = F.linear_cross_entropy(
            hidden, weight, safe, reduction="sum", ignore_index=ignore, options=how.options
        ).float()
    else:
        if how.none:
            rows = F.cross_entropy(logits, safe, ignore_index=ignore, reduction="none")
            return poison(rows.float(), marks)
        if logits.dtype == torch.float32:
            loss = F.cross_entropy(logits, safe, ignore_index=ignore, reduction="sum")
        else:  # one op: accumulated and returned in float32
            rows = F.cross_entropy(logits, safe, ignore_index=ignore, reduction="none")
            loss = rows.sum(dtype=torch.float32)
    if total is None:  # the values were checked on the host, or cannot be (traced)
        if how.mean:
            return loss / (safe != ignore).sum().clamp(min=1)
        return loss
    # "mean": the total is max(1, classes), or the old path's counted marks (see _TINY);
    # either is NaN where a target was refused. "sum": 0 or NaN.
    return loss / total if how.mean else loss + total


def _fold(how: _Delegated, total: Any, target: Any) -> None:
    """The screening's total into its device's deferred report (note_refusals, its checks
    made): not while a CUDA graph is captured (the report's copy would be captured too)."""
    if how.device >= 0 and not how.capturing():
        report = _REPORTS.get(how.device)
        if report is None:
            report = _REPORTS[how.device] = _DeviceReport(target.device)
        report.fold(total, how.vocab, how.ignore_index)


# Logits of at most this many elements are upcast to float32 before cross_entropy (the
# kernel's numerics, and vendor code's `F.cross_entropy(logits.float(), y)`): its own
# reduction then sums in float32, which saves the backward of a separate float32 sum of
# bf16 row losses. 4 Mi elements: the float32 logits, their log-softmax and its gradient
# take under 64 MiB more than bf16 ones would. Above it the memory matters more than an op
# (sm_90.json delegates only where the logits' memory is small beside the weight's).
_UPCAST_MAX = 1 << 22


LINEAR_CROSS_ENTROPY_FWD = declare(OpDecl(
    name="linear_cross_entropy_fwd",
    schema=(
        "Tensor hidden, Tensor weight, Tensor target, int ignore_index, str reduction, "
        "bool with_grad, bool dh_into_hidden=False -> (Tensor, Tensor, Tensor)"
    ),
    describe="(loss, dhidden, dweight) of cross_entropy(hidden @ weight.T, target), chunked",
    validate=_validate_fwd,
    plan=None,
    body=_fwd_body,
    jax_body=_jax_fwd_body,
    check_arrays=_check_arrays_fwd,
    check_values=_check_target_values,
    reference=_fwd_reference,
    backward=Backward(
        _fwd_grads, saves=("hidden", "weight", "target"), saves_outputs=(1, 2),
        nondiff_outputs=(1, 2), saves_for=_saves, materialize_grads=False,
    ),
    front=False,
    public=Front(
        OP,
        "Tensor hidden, Tensor weight, Tensor target, int ignore_index=-100, "
        "str reduction='mean' -> Tensor",
        _flags,
        _route,
    ),
    uses_matrix_units=True,
))  # fmt: skip
