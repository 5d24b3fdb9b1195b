"""OpDecl.training_route: eager training calls the arch's ``<op>_training`` table entry gives
backend "torch" run PyTorch's own op (rms_norm, layer_norm, softmax); the shipped tables
do so up to 8 Mi elements (bench/route_bound.py)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from _kernel_testing import DEVICE, need_triton  # noqa: E402

import greta_core.torch  # noqa: E402, F401  (registers torch.ops.greta)
from greta_core import configs, observe  # noqa: E402
from greta_core.ops import _calls  # noqa: E402
from greta_core.torch._declared import TORCH_EAGER  # noqa: E402
from greta_core.torch._declared import ops as entries  # noqa: E402

F = torch.nn.functional


def _inputs(op: str, w_dtype: Any = torch.bfloat16) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    g = torch.Generator().manual_seed(7)

    def t(*shape: int, dtype: Any = torch.bfloat16) -> Any:
        return torch.randn(*shape, generator=g, dtype=dtype).to(DEVICE).requires_grad_()

    x, w, b = t(3, 5, 32), t(32, dtype=w_dtype), t(32, dtype=w_dtype)
    return {
        "rms_norm": ((x, w), (1e-6,)),
        "layer_norm": ((x, w, b), (1e-5,)),
        "layer_norm_no_bias": ((x, w), (None, 1e-5)),
        "softmax": ((x,), ()),
    }[op]


def _torch_own(op: str, diff: tuple[Any, ...], rest: tuple[Any, ...]) -> Any:
    x = diff[0]
    n = (x.shape[-1],)
    if op == "rms_norm":
        return F.rms_norm(x, n, diff[1], rest[0])
    if op == "layer_norm":
        return F.layer_norm(x, n, diff[1], diff[2], rest[0])
    if op == "layer_norm_no_bias":
        return F.layer_norm(x, n, diff[1], None, rest[1])
    return torch.softmax(x, -1)


def _name(op: str) -> str:
    return "layer_norm" if op == "layer_norm_no_bias" else op


OPS = ["rms_norm", "layer_norm", "layer_norm_no_bias", "softmax"]


@pytest.fixture
def training(monkeypatch: pytest.MonkeyPatch) -> None:
    # On a GPU, plain tensors wanting grad take the eager training path; here the
    # predicate is forced so CPU tensors take it too (as test_declare_norms.py does).
    monkeypatch.setattr(_calls, "eager_training", lambda t: True)
    observe.reset()


@pytest.mark.parametrize("front", ["torch.ops", "entry"])
@pytest.mark.parametrize("op", OPS)
def test_backend_torch_runs_torchs_own_op(training: None, op: str, front: str) -> None:
    diff, rest = _inputs(op)
    fn = getattr(torch.ops.greta if front == "torch.ops" else entries, _name(op))
    with configs.Override({f"{_name(op)}_training": {"backend": "torch"}}):
        y = fn(*diff, *rest)
    assert observe.last_implementation(_name(op)) == TORCH_EAGER
    assert "greta" not in y.grad_fn.name()  # torch's own autograd node
    want = _torch_own(op, diff, rest)
    dy = torch.linspace(-1, 1, y.numel(), dtype=y.dtype).reshape(y.shape).to(DEVICE)
    # The same op on the same inputs: the same bits, forward and backward.
    assert torch.equal(y, want)
    for got, expected in zip(
        torch.autograd.grad(y, diff, dy), torch.autograd.grad(want, diff, dy), strict=True
    ):
        assert torch.equal(got, expected)


# The shipped bound (greta_core/configs/tables/default.json, bench/route_bound.py's H100 run).
BOUND = 8 * 1024 * 1024


@pytest.mark.parametrize("op", OPS)
def test_the_shipped_tables_route_small_calls_to_torch(training: None, op: str) -> None:
    need_triton()
    diff, rest = _inputs(op)
    entry = f"{_name(op)}_training"
    for arch in ("default", "sm_90", "gfx942", "gfx1100", "gfx1201"):
        assert configs.lookup(entry, arch, {"ELEMENTS": BOUND})["backend"] == "torch"
        assert configs.lookup(entry, arch, {"ELEMENTS": BOUND + 1})["backend"] == "greta"
    y = getattr(torch.ops.greta, _name(op))(*diff, *rest)
    assert "greta" not in y.grad_fn.name()
    assert observe.last_implementation(_name(op)) == TORCH_EAGER


def test_a_dtype_mix_torchs_op_lacks_stays_on_gretas_path(training: None) -> None:
    need_triton()
    diff, rest = _inputs("rms_norm", w_dtype=torch.float32)  # bf16 rows, fp32 weight
    with configs.Override({"rms_norm_training": {"backend": "torch"}}):
        y = torch.ops.greta.rms_norm(*diff, *rest)
    assert y.grad_fn.name() == "greta_rms_norm_fwd_eagerBackward"


def test_the_bound_reads_the_calls_elements(
    training: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A table with the rule the comment describes, ELEMENTS_max 480 (3 x 5 x 32 rows):
    # decided per shape, so the larger call keeps GRETA's path.
    need_triton()
    table = configs.lookup
    rule = {"when": {"ELEMENTS_max": 480}, "config": {"backend": "torch"}}

    def lookup(op: str, arch: str, features: Any = None) -> dict[str, Any]:
        if op == "softmax_training":
            return {"backend": "greta"} | (
                rule["config"] if configs._matches(rule["when"], features or {}) else {}
            )
        return table(op, arch, features)

    monkeypatch.setattr(configs, "lookup", lookup)
    (x,), _ = _inputs("softmax")
    assert torch.ops.greta.softmax(x).grad_fn.name() == "SoftmaxBackward0"
    big = torch.cat([x, x], 0).detach().requires_grad_()
    assert torch.ops.greta.softmax(big).grad_fn.name() == "greta_softmax_fwd_eagerBackward"
