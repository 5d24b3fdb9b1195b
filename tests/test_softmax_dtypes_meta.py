"""softmax keeps the other ops' dtype rule on every torch path, and meta tensors work
(issue 30 item 8): softmax took float64 where others refused it, and raised
NotImplementedError ("Cannot copy out of meta tensor") on meta tensors.

The rule, one place (torch/_norms_common.takes_reference): the raw binding launches the
kernel dtypes only; torch.ops.greta.* serves float64 (gradcheck) and meta tensors with the
torch reference, whichever path the call takes (CPU reference, the CPU interpreter, GPU).
"""

from __future__ import annotations

import pytest
import torch

import greta_core.torch  # noqa: F401  (registers torch.ops.greta)
from greta_core import raw, reference
from greta_core.errors import GretaInputError

# GRETA's kernels in training too (the tables hand small norm/softmax training calls to torch).
pytestmark = pytest.mark.usefixtures("greta_training")

ROW_OPS = ("softmax", "rms_norm", "layer_norm", "swiglu", "add_rms_norm")
REFERENCE = {
    "softmax": reference.softmax,
    "rms_norm": reference.rms_norm,
    "layer_norm": reference.layer_norm,
    "swiglu": lambda gate, up: reference.glu(gate, up, "silu"),
    "add_rms_norm": lambda x, r, w, eps: reference.add_rms_norm_fwd(x, r, w, eps)[:2],
}


def _args(name: str, dtype: torch.dtype, device: str = "cpu") -> tuple:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 32, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)
    w = torch.linspace(0.5, 1.5, 32, dtype=torch.float64).to(device=device, dtype=dtype)
    return {
        "softmax": (x,),
        "rms_norm": (x, w, 1e-6),
        "layer_norm": (x, w, w, 1e-6),
        "swiglu": (x, x.flip(0)),
        "add_rms_norm": (x, x.flip(0), w, 1e-6),
        "vec_add": (x[0], x[1]),
        "matmul": (x[:, :16], x[:, 16:].t().contiguous()),
    }[name]


@pytest.mark.parametrize("name", ROW_OPS)
def test_the_raw_binding_refuses_float64_like_the_other_row_ops(name: str) -> None:
    with pytest.raises(GretaInputError, match="has dtype float64; expected one of"):
        getattr(raw, name)(*_args(name, torch.float64))


@pytest.mark.parametrize("interpreter", ["0", "1"])
@pytest.mark.parametrize("name", ROW_OPS)
def test_torch_ops_serve_float64_with_the_reference_on_each_cpu_path(
    monkeypatch: pytest.MonkeyPatch, name: str, interpreter: str
) -> None:
    monkeypatch.setenv("GRETA_TRITON_ON_CPU", interpreter)
    args = _args(name, torch.float64)
    out = getattr(torch.ops.greta, name)(*args)
    ref = REFERENCE[name](*args)
    for got, want in zip(
        out if isinstance(out, tuple) else (out,),
        ref if isinstance(ref, tuple) else (ref,),
        strict=True,
    ):
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, want)  # float64 defaults: same function, same order


def test_softmax_float64_gradient_is_the_reference_gradient() -> None:
    x = _args("softmax", torch.float64)[0].requires_grad_()
    assert torch.autograd.gradcheck(torch.ops.greta.softmax, (x,))


@pytest.mark.parametrize("interpreter", ["0", "1"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("name", [*ROW_OPS, "vec_add", "matmul"])
def test_meta_tensors_give_the_result_shape_and_dtype(
    monkeypatch: pytest.MonkeyPatch, name: str, dtype: torch.dtype, interpreter: str
) -> None:
    monkeypatch.setenv("GRETA_TRITON_ON_CPU", interpreter)
    args = _args(name, dtype, "meta")
    out = getattr(torch.ops.greta, name)(*args)
    real = getattr(torch.ops.greta, name)(*_args(name, torch.float64))
    outs = out if isinstance(out, tuple) else (out,)
    reals = real if isinstance(real, tuple) else (real,)
    for got, shape_of in zip(outs, reals, strict=True):
        assert got.device.type == "meta"
        assert got.shape == shape_of.shape and got.dtype == dtype


def test_softmax_backward_on_meta_tensors() -> None:
    x = torch.empty(3, 5, 64, device="meta", requires_grad=True)
    y = torch.ops.greta.softmax(x)
    (dx,) = torch.autograd.grad(y, x, torch.empty_like(y))
    assert dx.device.type == "meta" and dx.shape == x.shape and dx.dtype == x.dtype
