"""linear_cross_entropy refuses a target that is no class (issue 30 item 8): >= vocab, or
negative and not ignore_index. It returned a finite loss in every binding; torch raises.

Values on the host (CPU tensors, JAX arrays) are refused by the call itself. A GPU tensor's
are checked on the device, with no host sync per call (issue 25): the call returns a NaN
loss, and the refusal is raised once the device reports it (by a later call, or
raise_refused_targets)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from contextlib import contextmanager  # noqa: E402

from _kernel_testing import DEVICE, ON_GPU  # noqa: E402

import greta_core.torch  # noqa: E402, F401
from greta_core import raw  # noqa: E402
from greta_core.errors import GretaInputError  # noqa: E402
from greta_core.ops import linear_cross_entropy as lce  # noqa: E402

VOCAB = 11
BAD = [VOCAB, VOCAB + 5, 2**40, -1, -7, -(2**40)]


@contextmanager
def refused(match: str):
    """The calls inside refuse the target: at once on the CPU; on a GPU each returns a
    NaN loss and the refusal comes when the device reports it."""
    losses: list[torch.Tensor] = []
    if not ON_GPU:
        with pytest.raises(GretaInputError, match=match):
            yield losses
        return
    yield losses
    assert losses and all(torch.isnan(loss).any() for loss in losses)
    with pytest.raises(GretaInputError, match="every entry must be in"):
        lce.raise_refused_targets(wait=True)


def _case(bad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    hidden = torch.randn(5, 8, device=DEVICE)
    weight = torch.randn(VOCAB, 8, device=DEVICE)
    target = torch.tensor([0, 3, -100, bad, 2], device=DEVICE)
    return hidden, weight, target


@pytest.mark.parametrize("bad", BAD)
def test_torch_refuses_it_too(bad: int) -> None:
    # On the CPU: on a GPU torch's refusal is a device-side assert, which would poison
    # the CUDA context of every later test in this process.
    hidden, weight, target = (t.cpu() for t in _case(bad))
    with pytest.raises((IndexError, RuntimeError)):
        torch.nn.functional.cross_entropy(hidden @ weight.t(), target)


@pytest.mark.parametrize("bad", BAD)
def test_raw_binding_refuses_a_target_outside_the_vocabulary(bad: int) -> None:
    hidden, weight, target = _case(bad)
    with refused(f"holds {bad}; every entry must be in") as losses:
        losses.append(raw.linear_cross_entropy(hidden, weight, target))
    scale = torch.ones(5, device=DEVICE)
    with pytest.raises(GretaInputError, match="every entry must be in"):
        raw.linear_cross_entropy_bwd(hidden, weight, target, scale)
        lce.raise_refused_targets(wait=True)


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_torch_op_refuses_a_target_outside_the_vocabulary(bad: int, reduction: str) -> None:
    hidden, weight, target = _case(bad)
    with refused("every entry must be in") as losses:
        losses.append(torch.ops.greta.linear_cross_entropy(hidden, weight, target, -100, reduction))


def test_ignore_index_is_still_allowed_and_a_negative_one_too() -> None:
    hidden, weight, target = _case(-1)
    target[2] = VOCAB - 1
    loss = raw.linear_cross_entropy(hidden, weight, target, ignore_index=-1, reduction="none")
    assert torch.isfinite(loss).all() and loss[3].item() == 0.0


@pytest.mark.parametrize("bad", [VOCAB, -1, -7])
def test_jax_binding_refuses_a_target_outside_the_vocabulary(bad: int) -> None:
    jnp = pytest.importorskip("jax.numpy")
    from greta_core import jax as gjax

    hidden = jnp.ones((5, 8), jnp.float32)
    weight = jnp.ones((VOCAB, 8), jnp.float32)
    target = jnp.array([0, 3, -100, bad, 2])
    with pytest.raises(GretaInputError, match="every entry must be in"):
        gjax.linear_cross_entropy(hidden, weight, target)


@pytest.mark.parametrize("bad", BAD)
def test_the_device_check_replaces_each_refused_entry_by_ignore_index(bad: int) -> None:
    # What a GPU call computes with (no value read on the host): the kernels and torch's
    # cross_entropy never see the refused class, and its NaN mark poisons the loss rows.
    target = torch.tensor([0, 3, -100, bad, 10, bad])
    safe, marks = lce.refuse_on_device(target, VOCAB, -100)
    assert safe.tolist() == [0, 3, -100, -100, 10, -100]
    refused = [False, False, False, True, False, True]
    assert torch.isnan(marks).tolist() == refused and marks.nan_to_num().eq(0).all()
    rows = lce.poison(torch.zeros(6), marks)
    assert torch.isnan(rows).tolist() == refused
    assert torch.isnan(lce.poison(torch.zeros(()), marks))
    assert lce.poison(torch.zeros(6), None).eq(0).all()
    # Counted (the delegated "mean"): 1 per class, ~0 for ignore_index, NaN if refused.
    _, counted = lce.refuse_on_device(target, VOCAB, -100, counted=True)
    assert torch.isnan(counted.sum())
    assert counted[[0, 1, 4]].tolist() == [1.0, 1.0, 1.0] and 0 < counted[2].item() < 1e-10


@pytest.mark.parametrize("ignore_index", [-100, -1, 0, 5, VOCAB, VOCAB + 3])
def test_the_device_check_knows_every_ignore_index(ignore_index: int) -> None:
    # ignore_index below, inside or above the vocabulary: each value is kept or refused
    # as the host check (refuse_on_host) decides.
    values = torch.arange(-110, VOCAB + 10)
    safe, counted = lce.refuse_on_device(values, VOCAB, ignore_index, counted=True)
    refused = ((values < 0) | (values >= VOCAB)) & (values != ignore_index)
    assert torch.isnan(counted).tolist() == refused.tolist()
    assert torch.equal(safe, values.masked_fill(refused, ignore_index))
    classes = ~refused & (values != ignore_index)
    assert counted[classes].eq(1).all()
    ignored = counted[values == ignore_index]
    assert ignored.numel() == 1 and 0 < ignored.item() < 1e-10


def test_mean_divisor_counts_classes_exactly_and_is_never_zero() -> None:
    # The delegated "mean" divides by the counted marks' sum: exactly the number of
    # classes (the ignore_index marks vanish beside any 1), and > 0 when all are ignored.
    target = torch.tensor([-100] * 1000 + [3] * 7 + [-100] * 1000)
    _, counted = lce.refuse_on_device(target, VOCAB, -100, counted=True)
    assert counted.sum().item() == 7.0
    _, ignored = lce.refuse_on_device(torch.full((4096,), -100), VOCAB, -100, counted=True)
    assert ignored.sum().item() > 0 and (torch.zeros(()) / ignored.sum()).item() == 0.0


def test_nothing_refused_nothing_poisoned() -> None:
    target = torch.tensor([0, 10, -100, 7])
    safe, marks = lce.refuse_on_device(target, VOCAB, -100)
    assert torch.equal(safe, target) and not marks.isnan().any()
    assert not torch.isnan(lce.poison(torch.zeros(()), marks))


class _FakeEvent:
    """torch.cuda.Event's part the report uses, done when the test says so."""

    def __init__(self) -> None:
        self.ready = False

    def record(self, stream=None) -> None:
        self.ready = False

    def query(self) -> bool:
        return self.ready

    def synchronize(self) -> None:
        self.ready = True


def test_the_device_report_copies_pending_sums_and_reports_once(monkeypatch) -> None:
    # The per-GPU report's logic on CPU tensors (its event faked): sums wait in a list, go
    # to the host in one copy when none is in flight and the interval has passed, are read
    # once the event is done; a refusal is reported once, and `wait` reads everything.
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    report = lce._DeviceReport(torch.device("cpu"))
    nan = torch.tensor(float("nan"))
    report.fold(torch.tensor(0.0), VOCAB, -100)  # the first call copies at once
    assert report.in_flight == 1 and not report.pending
    report.fold(nan, VOCAB, -100)  # a copy in flight: this one waits
    assert report.pending and not report.read(wait=False)  # the event is not done
    report.done.ready = True
    assert not report.read(wait=False)  # the copy held the clean sum only
    assert report.read(wait=True)  # the pending NaN, read with a sync
    assert not report.read(wait=True)  # reported once
    monkeypatch.setattr(lce, "_EVERY_S", 0.0)
    for _ in range(3):
        report.fold(torch.tensor(2.0), VOCAB, -100)
        report.done.ready = True
        assert not report.read(wait=False)
    report.fold(nan, VOCAB, -100)
    report.done.ready = True
    assert report.read(wait=False) and report.in_flight == 0 and not report.pending
    # Far more pending sums than the buffer holds: one sum, NaN if any is.
    report.fold(torch.tensor(0.0), VOCAB, -100)
    report.pending += [torch.tensor(0.0)] * (2 * lce._MOST) + [nan]
    report.done.ready = True
    report.read(wait=False)
    report.fold(torch.tensor(0.0), VOCAB, -100)
    assert report.in_flight == 1
    report.done.ready = True
    assert report.read(wait=False)
