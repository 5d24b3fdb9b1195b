"""linear_cross_entropy's dispatch: the config table picks GRETA's chunked kernel or torch's
own implementation per call shape, the pick is observable, and every implementation gives
the kernel's loss and gradients (float64 autograd of the unfused maths as the reference).

The decision is a pure function of (arch, shape, reduction, what torch offers); numerics run
on tiny shapes through the Triton interpreter (the kernel) and torch on CPU (delegated)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from _kernel_testing import DEVICE, ON_GPU  # noqa: E402

import greta_core.torch  # noqa: E402, F401
from greta_core import configs, observe  # noqa: E402
from greta_core.errors import ConfigError, GretaInputError  # noqa: E402
from greta_core.ops import linear_cross_entropy as lce  # noqa: E402

F = torch.nn.functional
DISPATCH = lce.DISPATCH
HAS_CORE_OP = hasattr(F, "linear_cross_entropy")
# torch's unchunked path, on every torch: torch.mm then F.cross_entropy.
UNCHUNKED = lce.LINEAR_CE


# --- the decision (pure) ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "h", "v", "want"),
    [
        (512, 4096, 128256, UNCHUNKED),  # N/H 0.125
        (256, 2048, 32000, UNCHUNKED),
        (1024, 4096, 128256, UNCHUNKED),  # N/H 0.25
        (2048, 2048, 262144, UNCHUNKED),  # N/H 1: at the threshold
        (2049, 2048, 262144, "greta"),
        (8192, 4096, 128256, "greta"),  # N/H 2
        (8192, 2048, 128256, "greta"),  # the 5.87 GiB core cell
        (16384, 4096, 151936, "greta"),
    ],
)
def test_sm90_table_delegates_where_the_logits_are_at_most_the_weight_gradient(
    n, h, v, want
) -> None:
    assert lce.choose("sm_90", n, v, h, "mean", "options") == want


def test_unmeasured_archs_keep_the_kernel_everywhere() -> None:
    for arch in ("default", "cpu", "gfx942", "gfx1100"):
        for n in (1, 512, 8192):
            assert lce.choose(arch, n, 128256, 4096, "mean", "options") == "greta"


def test_the_unchunked_backend_is_product_then_cross_entropy_on_every_torch() -> None:
    for api in lce.CORE_APIS:
        assert lce.choose("sm_90", 512, 128256, 4096, "mean", api) == lce.LINEAR_CE


@pytest.mark.parametrize(
    ("core_api", "reduction", "want"),
    [
        ("options", "mean", lce.CORE_CHUNKED),
        ("options", "sum", lce.CORE_CHUNKED),
        ("options", "none", "greta"),  # torch's chunked path takes mean/sum only
        ("plain", "mean", "greta"),  # torch 2.13 builds without options: GRETA's chunks
        ("none", "mean", "greta"),
    ],
)
def test_chunked_torch_backend_needs_its_options(core_api, reduction, want) -> None:
    with configs.Override({DISPATCH: {"backend": "torch-chunked"}}):
        assert lce.choose("sm_90", 8192, 128256, 2048, reduction, core_api) == want


def test_unknown_backend_and_core_api_are_refused() -> None:
    override = configs.Override({DISPATCH: {"backend": "cudnn"}})
    with override, pytest.raises(ConfigError, match="backend 'cudnn'"):
        lce.choose("sm_90", 8, 128, 64, "mean", "options")
    with pytest.raises(GretaInputError, match="core_api"):
        lce.choose("sm_90", 8, 128, 64, "mean", "2.13")


def test_dispatch_features_measure_the_logits_against_the_weight_gradient() -> None:
    f = lce.dispatch_features(2048, 128256, 4096)
    assert f == {"N": 2048, "V": 128256, "H": 4096, "N_per_H": 0.5, "liger_rows": 64}
    # N/H is exactly (full logits bytes) / (weight gradient bytes), whatever the vocabulary.
    assert f["N_per_H"] == (2048 * 128256) / (128256 * 4096)
    # Liger-Kernel 0.8.5: next_power_of_2(cdiv(BT, cdiv(V, H))) = next_pow2(2048 / 32).
    assert lce.dispatch_features(8192, 32768, 4096)["liger_rows"] == 1024
    assert lce.dispatch_features(16384, 128256, 2048)["liger_rows"] == 512


# --- the chunk floor --------------------------------------------------------------------


def test_chunk_floor_bounds_the_chunk_count_at_few_tokens() -> None:
    # The slow cell: 16 chunks of 128 rows without the floor, 4 of 512 with it.
    assert lce.chunk_rows(2048, 128256, 4096, 2) == 128
    assert lce.chunk_rows(2048, 128256, 4096, 2, 0.125) == 512
    assert len(lce.chunks(2048, 128256, 4096, 2, 0.125)) == 4
    # Where CHUNK_SCALE already makes larger chunks, the floor changes nothing.
    assert lce.chunk_rows(8192, 128256, 2048, 2, 0.125) == lce.chunk_rows(8192, 128256, 2048, 2)
    # Never more rows than there are.
    assert lce.chunk_rows(100, 128256, 4096, 2, 0.125) == 128
    assert lce.chunks(100, 128256, 4096, 2, 0.125) == [(0, 100)]


def test_chunk_floor_comes_from_the_config_table() -> None:
    assert lce.chunk_schedule("sm_90", 8192, 128256, 2048)[1] == 0.25
    assert lce.chunk_schedule("default", 8192, 128256, 2048)[1] == 0.0
    # sm_90 at Qwen3's and Gemma's B4 S2048 (8192 tokens, hidden 2048): 16 chunks of 512
    # rows where CHUNK_SCALE alone makes 32 of 256.
    for vocab in (151936, 256000):
        scale, floor = lce.chunk_schedule("sm_90", 8192, vocab, 2048)
        assert lce.chunk_rows(8192, vocab, 2048, scale) == 256
        assert len(lce.chunks(8192, vocab, 2048, scale, floor)) == 16


@pytest.mark.parametrize(
    ("n", "h", "v", "rows"),
    [
        # Where Liger-Kernel's own chunk is 1024+ rows sm_90 chunks as Liger does
        # (CHUNK_SCALE 1), or by the floor where that is larger.
        (32768, 2048, 32000, 2048),
        (32768, 2048, 128256, 1024),
        (32768, 4096, 32000, 4096),
        (32768, 4096, 128256, 1024),
        (8192, 4096, 32000, 1024),
        (8192, 4096, 32768, 1024),  # the HF grid's Mistral B4 S2048
        (16384, 4096, 32768, 2048),  # the HF grid's Mistral B1 S16384
        # Below it the logits chunk is twice Liger's (CHUNK_SCALE 2), or the floor.
        (32768, 2048, 262144, 512),
        (16384, 2048, 128256, 1024),  # the HF grid's Llama B1 S16384 (Liger: 512 rows)
        (8192, 2048, 32000, 1024),
        (8192, 2048, 128256, 512),
    ],
)
def test_sm90_chunk_schedule_takes_liger_s_chunk_from_1024_rows(n, h, v, rows) -> None:
    assert lce.chunk_rows(n, v, h, *lce.chunk_schedule("sm_90", n, v, h)) == rows


# --- what torch offers -------------------------------------------------------------------


def test_core_api_reads_the_installed_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    lce.core_api.cache_clear()
    try:
        want = "none"
        if HAS_CORE_OP:
            want = "options" if lce.core_options_class() is not None else "plain"
        assert lce.core_api() == want
        lce.core_api.cache_clear()
        monkeypatch.delattr(F, "linear_cross_entropy", raising=False)
        assert lce.core_api() == "none"
        lce.core_api.cache_clear()

        def old_style(input, linear_weight, target, *, reduction="mean", ignore_index=None):
            raise AssertionError("not called")

        monkeypatch.setattr(F, "linear_cross_entropy", old_style, raising=False)
        assert lce.core_api() == "plain"
    finally:
        lce.core_api.cache_clear()


# --- numerics of every implementation ----------------------------------------------------


def _case(n: int = 12, h: int = 16, v: int = 40, seed: int = 2):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=gen, dtype=torch.float64)
    weight = torch.randn(v, h, generator=gen, dtype=torch.float64) / 4
    target = torch.randint(0, v, (n,), generator=gen)
    target[3] = -100
    return hidden, weight, target


def _reference(hidden, weight, target, reduction: str, upstream):
    h, w = (t.detach().double().cpu().requires_grad_() for t in (hidden, weight))
    loss = F.cross_entropy(h @ w.t(), target.cpu(), ignore_index=-100, reduction=reduction)
    grads = torch.autograd.grad(loss, (h, w), upstream.double().cpu())
    return loss.detach(), grads


def _run(backend: str | None, reduction: str, dtype=torch.float32, case=None):
    """(loss, dhidden, dweight, what observe says ran) of the op under `backend`."""
    hidden, weight, target = case or _case()
    hidden = hidden.to(DEVICE, dtype).requires_grad_()
    weight = weight.to(DEVICE, dtype).requires_grad_()
    target = target.to(DEVICE)
    observe.reset()
    override = {DISPATCH: {"backend": backend}} if backend else {}
    with configs.Override(override):
        loss = torch.ops.greta.linear_cross_entropy(hidden, weight, target, -100, reduction)
    upstream = torch.rand(loss.shape, generator=torch.Generator().manual_seed(9)) + 0.5
    grads = torch.autograd.grad(loss, (hidden, weight), upstream.to(DEVICE))
    ran = observe.last_implementation("linear_cross_entropy")
    return loss.detach(), grads, ran, (hidden, weight, target, upstream)


@pytest.fixture
def screened_on_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """Targets screened as a GPU target is (no value read on the host), on any device: on
    the CPU the delegated path then runs a GPU call's ops, and torch's CPU cross_entropy
    raises IndexError where a GPU's would hit its device-side assert."""
    monkeypatch.setattr(lce, "_values_on_host", lambda target: False)


KERNEL = "triton" if ON_GPU else "triton-interpret"
# float32 inputs, reductions over <= 40 classes and 12 rows: float32 rounding of a few dozen
# terms, well inside 1e-5 relative; the tolerances scale with the magnitudes compared.
RTOL, ATOL = 1e-5, 1e-6


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize(("backend", "want"), [("greta", KERNEL), ("torch", UNCHUNKED)])
def test_each_backend_matches_float64_and_says_it_ran(backend, want, reduction) -> None:
    loss, grads, ran, (hidden, weight, target, upstream) = _run(backend, reduction)
    assert ran == want
    assert loss.dtype == torch.float32  # torch's bf16/fp32 loss is returned as the kernel's
    ref, ref_grads = _reference(hidden, weight, target, reduction, upstream)
    torch.testing.assert_close(loss.double().cpu(), ref, rtol=RTOL, atol=ATOL)
    for got, want_grad in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got.double().cpu(), want_grad, rtol=RTOL, atol=ATOL)


def test_linear_then_cross_entropy_runs_where_torch_has_no_op(monkeypatch) -> None:
    monkeypatch.setattr(lce, "core_api", lambda: "none")
    loss, grads, ran, (hidden, weight, target, upstream) = _run("torch", "mean")
    assert ran == lce.LINEAR_CE
    ref, ref_grads = _reference(hidden, weight, target, "mean", upstream)
    torch.testing.assert_close(loss.double().cpu(), ref, rtol=RTOL, atol=ATOL)
    for got, want_grad in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got.double().cpu(), want_grad, rtol=RTOL, atol=ATOL)


@pytest.mark.skipif(
    lce.core_api() != "options", reason="torch < 2.13 has no chunked linear_cross_entropy"
)
@pytest.mark.parametrize("screened", [False, True])  # True: the clamped target, ignore -1
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_torch_chunked_backend_matches_float64(request, reduction: str, screened: bool) -> None:
    if screened:
        request.getfixturevalue("screened_on_device")
    loss, grads, ran, (hidden, weight, target, upstream) = _run("torch-chunked", reduction)
    assert ran == lce.CORE_CHUNKED
    ref, ref_grads = _reference(hidden, weight, target, reduction, upstream)
    torch.testing.assert_close(loss.double().cpu(), ref, rtol=RTOL, atol=ATOL)
    for got, want_grad in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got.double().cpu(), want_grad, rtol=RTOL, atol=ATOL)


def test_bf16_backends_agree_within_bf16_rounding() -> None:
    # The same bf16 inputs through the kernel and torch: both round logits and gradients to
    # bf16 (8-bit mantissa), so they agree to a few bf16 ulps of the largest value.
    case = _case(n=16, h=32, v=64, seed=5)
    k_loss, k_grads, k_ran, _ = _run("greta", "mean", torch.bfloat16, case)
    t_loss, t_grads, t_ran, _ = _run("torch", "mean", torch.bfloat16, case)
    assert (k_ran, t_ran) == (KERNEL, UNCHUNKED)
    eps = torch.finfo(torch.bfloat16).eps
    assert abs(k_loss.item() - t_loss.item()) <= 4 * eps * abs(t_loss.item())
    for a, b in zip(k_grads, t_grads, strict=True):
        err = (a.double() - b.double()).abs().max().item()
        assert err <= 4 * eps * b.double().abs().max().item()


@pytest.mark.parametrize("screened", [False, True])
def test_all_ignored_mean_is_zero_on_every_backend(request, screened: bool) -> None:
    if screened:
        request.getfixturevalue("screened_on_device")
    hidden, weight, target = _case()
    target[:] = -100
    for backend in ("greta", "torch"):
        loss, grads, _, _ = _run(backend, "mean", case=(hidden, weight, target))
        assert loss.item() == 0.0  # torch's own mean would be NaN
        assert all(not g.any() for g in grads)


# --- the delegated path as a GPU call runs it (targets screened on the device) ------------


@pytest.mark.parametrize("ignore_index", [-100, -1, 0, 5, 11, 14])
def test_clamped_targets_keep_every_class_and_ignore_the_rest(ignore_index: int) -> None:
    # torch_targets' clamp: the classes as they are, ignore_index as torch's ignore index,
    # every other value a class or the ignore index (its NaN mark poisons the loss), so
    # cross_entropy never sees a class outside the vocabulary (CPU: IndexError).
    vocab = 11
    low, high, ignore = lce.torch_targets(vocab, ignore_index)
    values = torch.arange(-110, vocab + 10)
    safe = values.clamp(low, high)
    classes = (values >= 0) & (values < vocab) & (values != ignore_index)
    assert torch.equal(safe[classes], values[classes])
    assert safe[values == ignore_index].eq(ignore).all()
    assert (((safe >= 0) & (safe < vocab)) | (safe == ignore)).all()
    assert ignore == ignore_index or not 0 <= ignore < vocab  # no class is ignored anew
    rows = F.cross_entropy(
        torch.zeros(len(values), vocab), safe, ignore_index=ignore, reduction="none"
    )
    assert rows[classes].gt(0).all() and rows[values == ignore_index].eq(0).all()


# bf16 logits and gradients (8-bit mantissa) against float64 of the same bf16 inputs.
BF16_EPS = torch.finfo(torch.bfloat16).eps


@pytest.mark.parametrize("upcast", [True, False])  # float32 logits, or bf16 rows summed in fp32
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_device_screened_delegated_path_matches_float64(
    screened_on_device, monkeypatch, reduction: str, upcast: bool
) -> None:
    if not upcast:
        monkeypatch.setattr(lce, "_UPCAST_MAX", 0)
    case = _case(n=16, h=32, v=64, seed=5)
    case[2][[4, 9]] = -100
    loss, grads, ran, (hidden, weight, target, upstream) = _run(
        "torch", reduction, torch.bfloat16, case
    )
    assert ran == lce.LINEAR_CE and loss.dtype == torch.float32
    ref, ref_grads = _reference(hidden, weight, target, reduction, upstream)
    scale = ref.abs().max().item()
    torch.testing.assert_close(
        loss.double().cpu(), ref, rtol=4 * BF16_EPS, atol=4 * BF16_EPS * scale
    )
    for got, want in zip(grads, ref_grads, strict=True):
        assert (got.double().cpu() - want).norm() <= 8 * BF16_EPS * want.norm()


@pytest.mark.parametrize("backend", ["greta", "torch"])
def test_opcheck_under_each_backend(backend: str) -> None:
    # opcheck traces the op with symbolic sizes too (aot_dispatch_dynamic), as torch.compile's
    # dynamic shapes do: the route must take them (it traces the kernel op) without hashing a
    # SymInt into its per-size tables (it once raised "unhashable type: non-nested SymInt").
    hidden, weight, target = _case()
    args = (
        hidden.to(DEVICE, torch.float32).requires_grad_(),
        weight.to(DEVICE, torch.float32).requires_grad_(), target.to(DEVICE), -100, "mean",
    )  # fmt: skip
    with configs.Override({DISPATCH: {"backend": backend}}):
        torch.library.opcheck(torch.ops.greta.linear_cross_entropy.default, args)


def test_delegated_mean_is_the_vendor_expression(screened_on_device) -> None:
    # The loss grad_overhead.py times GRETA against: F.cross_entropy((h @ W.T).float(), y).
    # Same bf16 logits, float32 log-softmax: only the order of the float32 mean differs
    # (16 rows: within 16 float32 ulps); the bf16 gradients within one bf16 ulp.
    hidden, weight, target = _case(n=16, h=32, v=64, seed=7)
    h = hidden.to(DEVICE, torch.bfloat16).requires_grad_()
    w = weight.to(DEVICE, torch.bfloat16).requires_grad_()
    y = target.to(DEVICE)
    with configs.Override({DISPATCH: {"backend": "torch"}}):
        got = torch.ops.greta.linear_cross_entropy(h, w, y)
    want = F.cross_entropy((h @ w.T).float(), y)
    fp32_eps = torch.finfo(torch.float32).eps
    torch.testing.assert_close(got, want, rtol=16 * fp32_eps, atol=0.0)
    for a, b in zip(
        torch.autograd.grad(got, (h, w)), torch.autograd.grad(want, (h, w)), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=BF16_EPS, atol=BF16_EPS * b.abs().max().item())


@pytest.mark.parametrize("bad", [11, 11 + 5, 2**40, -1, -7, -(2**40)])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_device_screened_bad_target_gives_nan_then_the_error(
    screened_on_device, bad: int, reduction: str
) -> None:
    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(5, 8, generator=gen).to(DEVICE).requires_grad_()
    weight = torch.randn(11, 8, generator=gen).to(DEVICE).requires_grad_()
    target = torch.tensor([0, 3, -100, bad, 2], device=DEVICE)
    with configs.Override({DISPATCH: {"backend": "torch"}}):
        loss = torch.ops.greta.linear_cross_entropy(hidden, weight, target, -100, reduction)
    torch.autograd.grad(loss.sum(), (hidden, weight))  # the backward sees no bad class either
    if reduction == "none":
        assert torch.isnan(loss).tolist() == [False, False, False, True, False]
    else:
        assert torch.isnan(loss).item()
    if ON_GPU:  # the device's report: raised by a later call, or here after waiting
        with pytest.raises(GretaInputError, match="outside the vocabulary"):
            lce.raise_refused_targets(wait=True)


def test_bad_target_gets_the_kernels_error_on_the_delegated_path() -> None:
    hidden, weight, target = _case()
    target[0] = 40  # == vocab
    override = configs.Override({DISPATCH: {"backend": "torch"}})
    args = hidden.to(DEVICE, torch.float32), weight.to(DEVICE, torch.float32), target.to(DEVICE)
    if not ON_GPU:  # host values: the call itself refuses them
        with override, pytest.raises(GretaInputError, match="holds 40"):
            torch.ops.greta.linear_cross_entropy(*args)
        return
    # On a GPU the check runs on the device (no host sync): a NaN loss, then the error.
    from greta_core.ops.linear_cross_entropy import raise_refused_targets

    with override:
        loss = torch.ops.greta.linear_cross_entropy(*args)
    assert torch.isnan(loss).item()
    with pytest.raises(GretaInputError, match=r"outside the vocabulary.*\[0, 40\)"):
        raise_refused_targets(wait=True)


@pytest.mark.skipif(ON_GPU, reason="CPU: the torch reference path")
def test_cpu_reference_path_is_not_dispatched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRETA_TRITON_ON_CPU", "0")  # plain CPU tensors: the torch reference
    _, _, ran, _ = _run("torch", "mean")
    assert ran == "reference-torch"


def test_compiled_call_follows_the_table() -> None:
    torch._dynamo.reset()
    hidden, weight, target = _case()
    h = hidden.to(DEVICE, torch.float32).requires_grad_()
    w = weight.to(DEVICE, torch.float32).requires_grad_()
    target = target.to(DEVICE)

    def f(h, w, t):
        return torch.ops.greta.linear_cross_entropy(h, w, t)

    with configs.Override({DISPATCH: {"backend": "torch"}}):
        got = torch.compile(f, fullgraph=True, backend="aot_eager")(h, w, target)
        got_grads = torch.autograd.grad(got, (h, w))
    ref, ref_grads = _reference(h, w, target, "mean", torch.ones(()))
    torch.testing.assert_close(got.detach().double().cpu(), ref, rtol=RTOL, atol=ATOL)
    for g, r in zip(got_grads, ref_grads, strict=True):
        torch.testing.assert_close(g.double().cpu(), r, rtol=RTOL, atol=ATOL)


@pytest.mark.skipif(not ON_GPU, reason="GPU test: the arch's own table decides")
@pytest.mark.parametrize("n", [64, 2048])
def test_gpu_call_runs_what_the_arch_table_chose(n: int) -> None:
    # hidden 1024: 64 tokens is N/H 1/16 (the H100 table delegates), 2048 is 2 (the kernel).
    from greta_core.arch import device_arch

    h, v = 1024, 8192
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(n, h, generator=gen).to(DEVICE, torch.bfloat16).requires_grad_()
    weight = (torch.randn(v, h, generator=gen) / 32).to(DEVICE, torch.bfloat16).requires_grad_()
    target = torch.randint(0, v, (n,), generator=gen).to(DEVICE)
    observe.reset()
    loss = torch.ops.greta.linear_cross_entropy(hidden, weight, target)
    grads = torch.autograd.grad(loss, (hidden, weight))
    chose = lce.choose(device_arch(), n, v, h, "mean", lce.core_api())
    assert observe.last_implementation("linear_cross_entropy") == (
        "triton" if chose == "greta" else chose
    )
    ref, ref_grads = _reference(hidden, weight, target, "mean", torch.ones(()))
    # bf16 logits and gradients (8-bit mantissa) against float64 of the same bf16 inputs.
    eps = torch.finfo(torch.bfloat16).eps
    assert abs(loss.item() - ref.item()) <= 4 * eps * abs(ref.item())
    for got, want in zip(grads, ref_grads, strict=True):
        err = (got.double().cpu() - want).norm() / want.norm()
        assert err <= 8 * eps
