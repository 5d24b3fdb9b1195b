"""linear_cross_entropy's target screening on the device: one launch, no value read on
the host.

A GPU call never reads its target's values on the host (a sync per training step), and
no kernel may read a logits row at a class outside the vocabulary (torch's cross_entropy
would hit a device-side assert, which ends the CUDA context). One program walks the
target in blocks of BLOCK entries and writes:

- ``safe``: each class of [0, vocab) as itself, ``ignore_index`` as itself, every other
  entry (a refused one) as ``ignore_index``: nothing downstream reads out of bounds;
- ``total`` (fp32, one value): NaN if any entry was refused; else with COUNT
  max(1, the number of classes) ("mean"'s divisor: a batch all ignored divides its 0 by
  1), without it 0 (a "sum" adds it, poisoning the loss where it must);
- with MARKS, ``marks`` (fp32 [n]): NaN at each refused entry, else 0 (reduction="none"
  adds them to its rows).

The count is an int32 sum per lane, reduced once at the end: exact, and the same for any
schedule (one program). The deferred report (``ops.linear_cross_entropy._DeviceReport``)
reads ``total`` later; the loss it poisons shows the refusal meanwhile.
"""

from __future__ import annotations

import triton
import triton.language as tl

# The ints take any value: the screening gains nothing from their alignment, and one
# precompiled kernel then serves every call (AotSpec.int_divisible={}).
_INTS = ("n", "vocab", "ignore_index")


@triton.jit
def _classify(target_ptr, start, n, vocab, ignore_index, BLOCK: tl.constexpr):
    """One block of the target from `start`: (offsets, mask, t, is_class, refused). Lanes
    past the end read as ignore_index: neither a class nor refused."""
    offsets = start + tl.arange(0, BLOCK)
    mask = offsets < n
    t = tl.load(target_ptr + offsets, mask=mask, other=ignore_index)
    ignored = t == ignore_index
    is_class = (t >= 0) & (t < vocab) & ~ignored
    return offsets, mask, t, is_class, ~is_class & ~ignored


@triton.jit
def _total(classes, refused, COUNT: tl.constexpr):
    """(count, any refused, total) from the per-lane int32 sums: total is NaN if anything
    was refused, else max(1, count) with COUNT, else 0."""
    count = tl.sum(classes, axis=0)
    any_refused = tl.max(refused, axis=0) > 0
    total = tl.maximum(count.to(tl.float32), 1.0) if COUNT else count.to(tl.float32) * 0.0
    return count, any_refused, tl.where(any_refused, float("nan"), total)


@triton.jit(do_not_specialize_on_alignment=_INTS)
def screen_targets_kernel(
    target_ptr,
    n,
    vocab,
    ignore_index,
    safe_ptr,
    total_ptr,
    marks_ptr,
    COUNT: tl.constexpr,
    MARKS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    classes = tl.zeros((BLOCK,), dtype=tl.int32)
    refused = tl.zeros((BLOCK,), dtype=tl.int32)
    for start in range(0, n, BLOCK):
        offsets, mask, t, is_class, bad = _classify(
            target_ptr, start, n, vocab, ignore_index, BLOCK
        )
        tl.store(safe_ptr + offsets, tl.where(is_class, t, ignore_index), mask=mask)
        classes += is_class.to(tl.int32)
        refused += bad.to(tl.int32)
        if MARKS:
            tl.store(marks_ptr + offsets, tl.where(bad, float("nan"), 0.0), mask=mask)
    tl.store(total_ptr, _total(classes, refused, COUNT)[2])


# (COUNT, MARKS) per reduction: "mean" counts, "sum" adds 0, "none" adds per-row marks.
MODES = {"mean": (True, False), "sum": (False, False), "none": (False, True)}


@triton.jit(do_not_specialize_on_alignment=_INTS)
def poison_logits_kernel(
    target_ptr,
    n,
    vocab,
    ignore_index,
    logits_ptr,
    safe_ptr,
    total_ptr,
    MEAN: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """The screening for float32 logits [n, vocab] (contiguous) already computed: torch's
    ``cross_entropy`` with the call's own reduction then gives GRETA's loss, with no op
    after it (a training step's backward pays per autograd node). In place on the logits:

    - a refused entry becomes class c of a row whose first logit is NaN: that row's loss,
      and so the sum or mean, is NaN, as the kernel's is;
    - "mean" (MEAN) of a target with no class and nothing refused: ``safe[0]`` becomes
      class c of a row -inf but 0 at c, whose loss and gradient are exactly 0, so torch's
      mean is 0 / 1 (GRETA's rule) instead of 0 / 0.

    c is class 0, or 1 where ignore_index is 0: the caller makes sure it is < vocab.

    ``total`` is written as :func:`screen_targets_kernel` writes it, for the deferred
    report (NaN if anything was refused)."""
    c = (ignore_index == 0).to(tl.int64)
    classes = tl.zeros((BLOCK,), dtype=tl.int32)
    refused = tl.zeros((BLOCK,), dtype=tl.int32)
    for start in range(0, n, BLOCK):
        offsets, mask, t, is_class, bad = _classify(
            target_ptr, start, n, vocab, ignore_index, BLOCK
        )
        tl.store(safe_ptr + offsets, tl.where(is_class, t, tl.where(bad, c, ignore_index)),
                 mask=mask)  # fmt: skip
        tl.store(logits_ptr + offsets.to(tl.int64) * vocab, float("nan"), mask=bad)
        classes += is_class.to(tl.int32)
        refused += bad.to(tl.int32)
    count, any_refused, total = _total(classes, refused, MEAN)
    tl.store(total_ptr, total)
    if MEAN:  # noqa: SIM102  (a compile-time branch, then a run-time one)
        if (count == 0) & (n > 0) & ~any_refused:
            # Every thread's store of safe[0] above comes first.
            tl.debug_barrier()
            tl.store(safe_ptr, c)
            for start in range(0, vocab, BLOCK):
                cols = start + tl.arange(0, BLOCK)
                row = tl.where(cols == c, 0.0, float("-inf"))
                tl.store(logits_ptr + cols, row, mask=cols < vocab)


def aot_specs(arch: str) -> list:
    from greta_core import configs
    from greta_core.kernels._aot import AotSpec

    config = configs.lookup("linear_cross_entropy_targets", arch, {})
    return [
        AotSpec(
            name=f"screen_targets[{reduction}]",
            kernel=screen_targets_kernel,
            signature={
                "target_ptr": "*i64",
                "n": "i32",
                "vocab": "i32",
                "ignore_index": "i32",
                "safe_ptr": "*i64",
                "total_ptr": "*fp32",
                "marks_ptr": "*fp32",
            },
            constexprs={"COUNT": count, "MARKS": marks, "BLOCK": config["BLOCK"]},
            options=configs.launch_options(config, arch),
            # Every int unspecialised on alignment: one kernel for all their values.
            int_divisible={},
        )
        for reduction, (count, marks) in MODES.items()
    ] + [
        AotSpec(
            name=f"poison_logits[{'mean' if mean else 'sum,none'}]",
            kernel=poison_logits_kernel,
            signature={
                "target_ptr": "*i64",
                "n": "i32",
                "vocab": "i32",
                "ignore_index": "i32",
                "logits_ptr": "*fp32",
                "safe_ptr": "*i64",
                "total_ptr": "*fp32",
            },
            constexprs={"MEAN": mean, "BLOCK": config["BLOCK"]},
            options=configs.launch_options(config, arch),
            int_divisible={},
        )
        for mean in (True, False)
    ]
