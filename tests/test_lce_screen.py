"""linear_cross_entropy's delegated path screens its target with one kernel launch
(kernels/lce_targets.py) instead of a chain of torch ops (bucketize, take, sum, clamp).

The kernels run through Triton's interpreter on the CPU (a GPU where there is one) against
a torch reference; the delegated loss they feed gives the values and gradients of the path
they replaced (still what a tensor subclass takes); and with float32 logits a
forward+backward runs torch's own ops and one launch of the screening, nothing else (the
screening writes into the logits what a reduction after them would have done)."""

from __future__ import annotations

import collections

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from _kernel_testing import DEVICE, ON_GPU, need_triton  # noqa: E402
from torch.utils._python_dispatch import (  # noqa: E402
    TorchDispatchMode,
    _disable_current_modes,
)

import greta_core.torch  # noqa: E402, F401
from greta_core import configs  # noqa: E402
from greta_core.arch import arch_of  # noqa: E402
from greta_core.ops import linear_cross_entropy as lce  # noqa: E402
from greta_core.ops._plan import run  # noqa: E402

F = torch.nn.functional
VOCAB = 11
# The table's delegation, and the screening kernel on (as the shipped tables have it:
# test_the_shipped_tables_screen_with_the_kernel; the torch ops' screening is KERNEL false).
TORCH_BACKEND = {lce.DISPATCH: {"backend": "torch"}, lce.SCREEN: {"KERNEL": True}}


def _screen(target: torch.Tensor, ignore_index: int, reduction: str) -> tuple:
    arch = arch_of(target)
    plan = lce.plan_screen(target.shape[0], VOCAB, ignore_index, reduction, arch)
    return run(plan, (target,))


def _expected(values: torch.Tensor, ignore_index: int, reduction: str) -> tuple:
    """What the kernel must write, by torch ops on the host."""
    ignored = values == ignore_index
    classes = (values >= 0) & (values < VOCAB) & ~ignored
    refused = ~classes & ~ignored
    safe = torch.where(classes, values, torch.full_like(values, ignore_index))
    total = float(max(1, int(classes.sum()))) if reduction == "mean" else 0.0
    if refused.any():
        total = float("nan")
    marks = torch.where(refused, float("nan"), 0.0)
    return safe, total, marks


@pytest.mark.parametrize("ignore_index", [-100, -1, 0, 5, VOCAB, VOCAB + 3])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_screening_kernel_matches_the_host_rule(ignore_index: int, reduction: str) -> None:
    # In range, ignored, negative, >= vocab and far out of int32, with ignore_index below,
    # inside and above the vocabulary.
    need_triton()
    values = torch.cat([torch.arange(-110, VOCAB + 10), torch.tensor([2**40, -(2**40)])])
    outs = _screen(values.to(DEVICE), ignore_index, reduction)
    safe, total, marks = _expected(values, ignore_index, reduction)
    assert torch.equal(outs[0].cpu(), safe)
    assert outs[1].shape == () and outs[1].dtype == torch.float32
    want = torch.tensor(total)
    torch.testing.assert_close(outs[1].cpu(), want, rtol=0, atol=0, equal_nan=True)
    if reduction == "none":
        assert torch.equal(torch.isnan(outs[2].cpu()), torch.isnan(marks))
        assert outs[2].cpu().nan_to_num().eq(0).all()
    else:
        assert len(outs) == 2


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_screening_kernel_counts_classes_over_several_blocks(reduction: str) -> None:
    # More entries than one BLOCK: the count is exact, and a refusal in the last block only
    # still poisons the total.
    need_triton()
    block = configs.lookup(lce.SCREEN, "cpu", {})["BLOCK"]
    gen = torch.Generator().manual_seed(4)
    values = torch.randint(0, VOCAB, (2 * block + 37,), generator=gen)
    values[::3] = -100
    for target, all_ignored in ((values, False), (torch.full_like(values, -100), True)):
        outs = _screen(target.to(DEVICE), -100, reduction)
        safe, total, _ = _expected(target, -100, reduction)
        assert torch.equal(outs[0].cpu(), safe)
        assert outs[1].item() == total
        assert not all_ignored or total == (1.0 if reduction == "mean" else 0.0)
    refused = values.clone()
    refused[-1] = VOCAB
    outs = _screen(refused.to(DEVICE), -100, reduction)
    assert torch.isnan(outs[1]).item() and outs[0][-1].item() == -100


def _poison(target: torch.Tensor, logits: torch.Tensor, ignore_index: int, reduction: str):
    arch = arch_of(target)
    plan = lce.plan_poison(target.shape[0], logits.shape[1], ignore_index, reduction, arch)
    return run(plan, (target, logits))


@pytest.mark.parametrize("ignore_index", [-100, 0, 5, VOCAB])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_poisoning_kernel_writes_what_the_reduction_after_the_loss_did(
    ignore_index: int, reduction: str
) -> None:
    # Float32 logits: the refused rows get class c (0, or 1 where ignore_index is 0) and a
    # NaN first logit, every other row is left as it was; cross_entropy with the call's own
    # reduction then gives the old path's loss (screening, then divide or add).
    need_triton()
    values = torch.cat([torch.arange(-3, VOCAB + 3), torch.tensor([2**40, ignore_index])])
    gen = torch.Generator().manual_seed(3)
    before = torch.randn(len(values), VOCAB, generator=gen)
    logits = before.clone().to(DEVICE)
    safe, total = (o.cpu() for o in _poison(values.to(DEVICE), logits, ignore_index, reduction))
    want_safe, want_total, marks = _expected(values, ignore_index, reduction)
    refused = torch.isnan(marks)
    c = 1 if ignore_index == 0 else 0
    assert torch.equal(safe, torch.where(refused, c, want_safe))
    torch.testing.assert_close(total, torch.tensor(want_total), rtol=0, atol=0, equal_nan=True)
    logits = logits.cpu()
    assert torch.isnan(logits[:, 0]).tolist() == refused.tolist()
    assert torch.equal(logits[~refused], before[~refused])
    assert torch.equal(logits[refused, 1:], before[refused, 1:])
    old = F.cross_entropy(before, want_safe, ignore_index=ignore_index, reduction="sum")
    new = F.cross_entropy(logits, safe, ignore_index=ignore_index, reduction=reduction)
    assert torch.isnan(new).any() and torch.isnan(old + marks.sum())


@pytest.mark.parametrize("ignore_index", [-100, 0])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_poisoning_kernel_gives_zero_for_a_target_all_ignored(ignore_index, reduction) -> None:
    # "mean" of no class is 0 (GRETA's rule; torch's own mean is 0 / 0): row 0 becomes class
    # c of [-inf, ..., 0 at c, ..., -inf] (a vocabulary over several blocks), whose loss and
    # gradient are exactly 0. "sum" and "none" leave target and logits as they are.
    need_triton()
    vocab = 2 * configs.lookup(lce.SCREEN, "cpu", {})["BLOCK"] + 5
    target = torch.full((3,), ignore_index, device=DEVICE)
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    before = logits.clone()
    logits.requires_grad_()
    with torch.no_grad():
        safe, total = _poison(target, logits, ignore_index, reduction)
    loss = F.cross_entropy(logits, safe, ignore_index=ignore_index, reduction=reduction)
    (grad,) = torch.autograd.grad(loss.sum(), logits)
    c = 1 if ignore_index == 0 else 0
    if reduction == "mean":
        assert safe.tolist() == [c, ignore_index, ignore_index] and total.item() == 1.0
        row = torch.full((vocab,), float("-inf"), device=DEVICE)
        row[c] = 0.0
        assert torch.equal(logits[0].detach(), row)
        assert torch.equal(logits[1:].detach(), before[1:])
    else:
        assert safe.tolist() == [ignore_index] * 3 and total.item() == 0.0
        assert torch.equal(logits.detach(), before)
    assert loss.eq(0).all() and grad.eq(0).all()


class _Plain(torch.Tensor):
    """A tensor subclass: the delegated path screens it with the torch ops it used before
    the kernel (bucketize, take, sum, then torch_targets' clamp)."""


@pytest.fixture
def device_values(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """CPU targets screened as GPU targets are (no value read on the host). Returns the
    screenings that ran, in order: "kernel" or "torch ops"."""
    monkeypatch.setattr(lce, "_values_on_host", lambda target: False)
    ran: list[str] = []
    for name, label in (
        ("_launch_screen", "kernel"), ("_launch_poison", "poison kernel"),
        ("refuse_on_device", "torch ops"),
    ):  # fmt: skip
        real = getattr(lce, name)

        def spy(*args, real=real, label=label):
            ran.append(label)
            return real(*args)

        monkeypatch.setattr(lce, name, spy)
    return ran


def _loss_and_grads(target: torch.Tensor, reduction: str):
    gen = torch.Generator().manual_seed(6)
    hidden = torch.randn(9, 16, generator=gen).to(DEVICE, torch.bfloat16).requires_grad_()
    weight = (torch.randn(VOCAB, 16, generator=gen) / 4).to(DEVICE, torch.bfloat16)
    weight.requires_grad_()
    with configs.Override(TORCH_BACKEND):
        loss = torch.ops.greta.linear_cross_entropy(hidden, weight, target, -100, reduction)
    upstream = torch.rand(loss.shape, generator=gen).to(DEVICE) + 0.5
    grads = torch.autograd.grad(loss, (hidden, weight), upstream)
    return loss.detach().as_subclass(torch.Tensor), grads


@pytest.mark.parametrize("upcast", [True, False])  # float32 logits, or bf16 rows summed
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_delegated_loss_is_the_previous_paths_to_the_bit(
    device_values, monkeypatch, reduction: str, upcast: bool
) -> None:
    # Same torch ops on the same logits. bf16 rows: "mean" divides by the same float32
    # count (the old counted marks' sum rounds to it exactly), "sum" and "none" add zeros.
    # float32 logits: cross_entropy's own reduction, whose "mean" divides its float32 sum
    # by the same count of classes. Bit for bit.
    need_triton()
    if not upcast:
        monkeypatch.setattr(lce, "_UPCAST_MAX", 0)
    target = torch.tensor([0, 3, -100, 10, 2, -100, 7, 7, 1], device=DEVICE)
    loss, grads = _loss_and_grads(target, reduction)
    old_loss, old_grads = _loss_and_grads(target.as_subclass(_Plain), reduction)
    assert torch.equal(loss, old_loss)
    for new, old in zip(grads, old_grads, strict=True):
        assert torch.equal(new, old.as_subclass(torch.Tensor))
    assert device_values == ["poison kernel" if upcast else "kernel", "torch ops"]


@pytest.mark.parametrize("upcast", [True, False])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_delegated_refusal_poisons_as_the_previous_path(
    device_values, monkeypatch, reduction: str, upcast: bool
) -> None:
    need_triton()
    if not upcast:
        monkeypatch.setattr(lce, "_UPCAST_MAX", 0)
    target = torch.tensor([0, 3, -100, VOCAB, 2, -100, -7, 7, 1], device=DEVICE)
    loss, grads = _loss_and_grads(target, reduction)
    if upcast and reduction != "none":  # NaN logits: NaN reaches all of dweight and the
        # refused rows of dhidden (a NaN loss's step poisons what it updates)
        assert torch.isnan(grads[1]).all() and torch.isnan(grads[0][[3, 6]]).all()
    if ON_GPU:  # the device's report of this call, before the next call raises it
        from greta_core.errors import GretaInputError

        with pytest.raises(GretaInputError, match="outside the vocabulary"):
            lce.raise_refused_targets(wait=True)
    old_loss, _ = _loss_and_grads(target.as_subclass(_Plain), reduction)
    assert torch.equal(torch.isnan(loss), torch.isnan(old_loss))
    assert torch.isnan(loss).any()
    if reduction == "none":  # the other rows are the old path's, bit for bit
        keep = ~torch.isnan(loss)
        assert torch.equal(loss[keep], old_loss[keep])


class _AtenOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.seen[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


# Views and metadata: their count differs between two spellings of one product.
_VIEWS = {"t", "permute", "detach", "view", "alias", "transpose", "_unsafe_view", "expand"}


def _ops(fn, inputs) -> collections.Counter:
    out = fn()
    grads = torch.ones_like(out)
    with _AtenOps() as mode:
        out = fn()
        torch.autograd.grad(out, inputs, grads)
    return collections.Counter({k: v for k, v in mode.seen.items() if k not in _VIEWS})


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_delegated_step_is_torchs_ops_and_one_launch(device_values, monkeypatch, reduction) -> None:
    # The aten ops of one forward+backward beside the expression the path stands for: the
    # same (no divide or poisoning add after cross_entropy: a host-bound step pays per
    # autograd node), and one launch of the screening kernel (its allocations and launch
    # kept out of the count, as the interpreter's copies would be). The old chain
    # (bucketize, take, sum, clamp) or a reduction after the loss fails.
    need_triton()
    # A GPU's deferred report copies its pending sums every 10 ms or 64 calls, not per call
    # (on a GPU the counted call made that copy: a slice more); kept out of the count.
    monkeypatch.setattr(lce, "_REPORTS", {})
    monkeypatch.setattr(lce, "_EVERY_S", float("inf"))
    launches = []
    launch = lce._launch_poison

    def counted(how, target, logits):
        launches.append(target.shape)
        with _disable_current_modes():
            return launch(how, target, logits)

    monkeypatch.setattr(lce, "_launch_poison", counted)
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(8, 64, generator=gen).to(DEVICE, torch.bfloat16).requires_grad_()
    w = (torch.randn(128, 64, generator=gen) * 0.1).to(DEVICE, torch.bfloat16).requires_grad_()
    y = torch.randint(0, 128, (8,), generator=gen).to(DEVICE)
    vendor = _ops(lambda: F.cross_entropy((h @ w.T).float(), y, reduction=reduction), (h, w))
    with configs.Override(TORCH_BACKEND):
        greta = _ops(lambda: torch.ops.greta.linear_cross_entropy(h, w, y, -100, reduction), (h, w))
    assert len(launches) == 2  # one per call: _ops's warm-up and the counted one
    assert greta == vendor


def test_the_shipped_tables_screen_with_the_kernel() -> None:
    for arch in ("default", "sm_90", "gfx942", "gfx1100", "gfx1201"):
        assert configs.lookup(lce.SCREEN, arch, {})["KERNEL"] is True
