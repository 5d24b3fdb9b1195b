"""apply_greta on tiny random-init Hugging Face models of every supported family.

Logits, loss and gradients of the patched model match the unpatched one; generate gives
the same tokens; a padding mask falls back to SDPA, observably. The models run on the
torch-reference path of the ops (fast); the kernels themselves are tested through the
Triton interpreter in test_kernel_fused.py / test_kernel_norms.py, and one test here runs
a whole model through the interpreter.
"""

from __future__ import annotations

import copy
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from greta_core import configs, observe  # noqa: E402
from greta_core.errors import GretaInputError  # noqa: E402
from greta_core.transformers import (  # noqa: E402
    FAMILIES,
    GretaFallbackWarning,
    _fallback,
    apply_greta,
    revert_greta,
)
from greta_core.transformers import apply as apply_module  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=128,
    max_position_embeddings=64,
    pad_token_id=0,
)
# GPU: the Triton attention kernel takes head_dim 64/128.
HEAD_DIM = 64 if DEVICE == "cuda" else 16


def expected(op: str, dtype: torch.dtype = torch.float32, rows: int = 0) -> str:
    """What observe reports: CPU runs the ops' references; on a GPU the Triton kernels, but
    attention falls back to SDPA for float32 (the Triton kernel takes fp16/bf16) and
    linear_cross_entropy runs what the arch's dispatch table picks for `rows` tokens."""
    if DEVICE == "cpu":
        return "reference-torch"
    if op == "linear_cross_entropy":
        from greta_core.arch import arch_of
        from greta_core.ops import linear_cross_entropy as lce

        arch = arch_of(torch.empty(0, device=DEVICE))
        vocab, hidden = TINY["vocab_size"], TINY["hidden_size"]
        picked = lce.choose(arch, rows, vocab, hidden, "mean", lce.core_api())
        return "triton" if picked == "greta" else picked
    return "torch-sdpa" if op == "attention" and dtype == torch.float32 else "triton"


def tiny_model(family: str, dtype: torch.dtype = torch.float32, seed: int = 0):
    config_cls = transformers.AutoConfig.for_model(family).__class__
    extra = {"sliding_window": None} if family in ("mistral", "qwen2") else {}
    config = config_cls(**TINY, head_dim=HEAD_DIM, **extra)
    if family == "gemma":
        config.hidden_act = "gelu_pytorch_tanh"
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return model.to(device=DEVICE, dtype=dtype)


@pytest.fixture(autouse=True)
def _reference_path(monkeypatch: pytest.MonkeyPatch):
    """Models run the ops' torch references on CPU (the interpreter is too slow for them)."""
    monkeypatch.delenv("GRETA_TRITON_ON_CPU", raising=False)
    monkeypatch.setattr(_fallback, "_warned", set())
    yield
    for key in apply_module.patched_targets():  # model instances and family names
        revert_greta(key)


def _inputs(seed: int = 1, batch: int = 2, seq: int = 12) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(1, 128, (batch, seq), generator=gen).to(DEVICE)


def _train_step(model, ids):
    model.train()
    model.zero_grad()
    out = model(ids, labels=ids)
    out.loss.backward()
    return out, {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp(min=1)).item()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_patched_model_matches_unpatched_fp32(family) -> None:
    model = tiny_model(family)
    ids = _inputs()
    with torch.no_grad():
        ref_logits = model.eval()(ids).logits
    ref_out, ref_grads = _train_step(model, ids)
    ref_tokens = model.eval().generate(ids, max_new_tokens=5, do_sample=False)

    patched = copy.deepcopy(model)
    report = apply_greta(patched)
    assert report.family == family and report.mode == "model"
    assert set(report.kernels) == {
        "rms_norm", "rope", "attention", "swiglu", "add_rms_norm", "cross_entropy"
    }  # fmt: skip
    with torch.no_grad():
        logits = patched.eval()(ids).logits
    for op in (
        "rms_norm",
        "rope",
        "attention",
        "add_rms_norm",
        "geglu" if family == "gemma" else "swiglu",
    ):
        assert observe.last_implementation(op) == expected(op), op
    assert _rel(logits, ref_logits) < 1e-5

    out, grads = _train_step(patched, ids)
    assert out.logits is None  # the fused loss: no logits in training
    want = expected("linear_cross_entropy", rows=ids.numel())
    assert observe.last_implementation("linear_cross_entropy") == want
    assert abs(out.loss.item() - ref_out.loss.item()) < 1e-5
    for name, g in grads.items():
        assert _rel(g, ref_grads[name]) < 1e-4, name

    tokens = patched.eval().generate(ids, max_new_tokens=5, do_sample=False)
    assert torch.equal(tokens, ref_tokens)


@pytest.mark.parametrize("family", ["llama", "gemma"])
def test_patched_model_matches_unpatched_bf16(family) -> None:
    model = tiny_model(family, torch.bfloat16)
    ids = _inputs(seed=2)
    with torch.no_grad():
        ref = model.eval()(ids).logits.float()
    ref_out, ref_grads = _train_step(model, ids)
    apply_greta(model)
    with torch.no_grad():
        logits = model.eval()(ids).logits.float()
    assert observe.last_implementation("attention") == expected("attention", torch.bfloat16)
    out, grads = _train_step(model, ids)
    # bf16 noise: each implementation rounds at different points (GRETA keeps fp32 inside).
    assert _rel(logits, ref) < 3e-2
    assert abs(out.loss.item() - ref_out.loss.item()) < 3e-2 * ref_out.loss.item()
    lm = next(n for n in grads if "embed_tokens" in n)
    assert _rel(grads[lm], ref_grads[lm]) < 1e-1


def test_padding_mask_falls_back_to_sdpa_observably() -> None:
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32  # GRETA attention's dtype
    model = tiny_model("llama", dtype).eval()
    ids = _inputs(seed=3)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding, as generate pads
    with torch.no_grad():
        ref = model(ids, attention_mask=mask).logits
    apply_greta(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            logits = model(ids, attention_mask=mask).logits
            model(ids, attention_mask=mask)
    fallbacks = [w for w in caught if issubclass(w.category, GretaFallbackWarning)]
    assert len(fallbacks) == 1  # once, not per layer or call
    assert "attention mask" in str(fallbacks[0].message)
    assert observe.last_implementation("attention") == "torch-sdpa"
    assert _rel(logits[:, 4:], ref[:, 4:]) < (1e-5 if dtype == torch.float32 else 3e-2)
    # An all-ones mask is no mask: GRETA's attention runs again.
    with torch.no_grad():
        model(ids, attention_mask=torch.ones_like(ids))
    assert observe.last_implementation("attention") == expected("attention", dtype)
    assert expected("attention", dtype) != "torch-sdpa"


def test_generate_with_left_padding_matches_unpatched() -> None:
    model = tiny_model("qwen2").eval()
    ids = _inputs(seed=4)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
    apply_greta(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GretaFallbackWarning)
        got = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
    assert torch.equal(got, ref)


def test_class_mode_patches_models_built_afterwards() -> None:
    ref_model = tiny_model("mistral")
    ids = _inputs(seed=5)
    with torch.no_grad():
        ref = ref_model.eval()(ids).logits
    report = apply_greta("mistral")
    assert report.mode == "classes"
    model = tiny_model("mistral")  # same seed: same weights
    observe.reset()
    with torch.no_grad():
        logits = model.eval()(ids).logits
    assert observe.last_implementation("attention") == expected("attention")
    assert observe.last_implementation("rms_norm") == expected("rms_norm")
    assert _rel(logits, ref) < 1e-5
    revert_greta("mistral")
    observe.reset()
    with torch.no_grad():
        tiny_model("mistral").eval()(ids)
    assert observe.last_implementation("rms_norm") is None


def test_flags_leave_unselected_modules_alone(greta_training: None) -> None:
    # greta_training: the norm runs GRETA's kernel in training too (a GPU's tables hand so
    # small a call to torch's F.rms_norm).
    model = tiny_model("llama")
    report = apply_greta(model, attention=False, cross_entropy=False, add_rms_norm=False)
    assert report.kernels == ("rms_norm", "rope", "swiglu")
    assert model.config._attn_implementation == "sdpa"
    observe.reset()
    model.train()
    out = model(_inputs(), labels=_inputs())
    assert out.logits is not None  # the model's own loss
    assert observe.last_implementation("linear_cross_entropy") is None
    assert observe.last_implementation("add_rms_norm") is None
    assert observe.last_implementation("rms_norm") == expected("rms_norm")
    revert_greta(model)
    assert "forward" not in model.model.norm.__dict__


def test_unsupported_model_type_is_a_clear_error() -> None:
    with pytest.raises(GretaInputError, match="model type 'gpt2' is not supported"):
        apply_greta("gpt2")


def _compiled_call_gets_a_causal_mask(dtype: torch.dtype) -> bool:
    """Whether transformers hands the attention function a mask for an unpadded causal batch
    while torch.compile traces, asked through its own registries with SDPA's mask function
    (as GRETA registers it). It does where dynamo folds torch.compiler.is_exporting() to
    True (torch 2.11; transformers names torch 2.14 and pytorch#176499): the mask cannot be
    skipped there, so GRETA's attention falls back to SDPA inside compiled graphs."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    seen: list[bool] = []

    def probe(module, query, key, value, attention_mask, **kwargs):
        seen.append(attention_mask is not None)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("greta_test_probe", probe)
    AttentionMaskInterface.register("greta_test_probe", sdpa_mask)
    model = tiny_model("llama", dtype)
    model.set_attn_implementation("greta_test_probe")
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend="eager")(_inputs(seed=6))
    assert seen
    return any(seen)


def test_torch_compile_trains_through_greta_ops() -> None:
    """A compiled training step: same loss and gradients, and the graph holds GRETA's ops."""
    # bf16 on a GPU: the dtype GRETA's attention kernel takes (fp32 falls back to SDPA there).
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    masked = _compiled_call_gets_a_causal_mask(dtype)
    model = tiny_model("llama", dtype)
    ids = _inputs(seed=6)
    ref_out, ref_grads = _train_step(model, ids)
    # "always": GRETA's attention in training too (an H100's table otherwise keeps SDPA there).
    apply_greta(model, attention="always")
    targets: set[str] = set()

    def backend(gm, example_inputs):
        targets.update(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    model.zero_grad()
    out = compiled(ids, labels=ids)
    out.loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert abs(out.loss.item() - ref_out.loss.item()) < tol * ref_out.loss.item()
    for name, g in grads.items():
        assert _rel(g, ref_grads[name]) < tol * 10, name
    ops = ["rms_norm", "rope", "add_rms_norm", "swiglu", "linear_cross_entropy"]
    if masked:  # GRETA's documented fallback for a real mask: SDPA, not greta::attention
        assert not any("greta.attention" in t for t in targets), sorted(targets)
        assert any("scaled_dot_product_attention" in t for t in targets), sorted(targets)
    else:
        ops.append("attention")
    for op in ops:
        assert any(f"greta.{op}" in t for t in targets), (op, sorted(targets))


def test_whole_model_through_the_triton_interpreter(
    monkeypatch: pytest.MonkeyPatch, greta_training: None
) -> None:
    """The same comparison with the real Triton kernels (interpreter on CPU; GPU as is)."""
    from greta_core.arch import interpreter_active

    if DEVICE == "cpu" and not interpreter_active():
        pytest.skip("needs TRITON_INTERPRET=1 on CPU")
    monkeypatch.setenv("GRETA_TRITON_ON_CPU", "1")
    model = tiny_model("llama")
    ids = _inputs(seed=7, batch=1, seq=6)
    ref_out, ref_grads = _train_step(model, ids)
    apply_greta(model)
    # GRETA's own kernels for every op: 6 tokens of a 64-wide model is where the sm_90 table
    # hands linear_cross_entropy to torch (tests/test_lce_dispatch.py tests that choice).
    with configs.Override({"linear_cross_entropy_dispatch": {"backend": "greta"}}):
        out, grads = _train_step(model, ids)
    expected = "triton-interpret" if DEVICE == "cpu" else "triton"
    for op in ("rms_norm", "rope", "swiglu", "add_rms_norm", "linear_cross_entropy"):
        assert observe.last_implementation(op) == expected, op
    assert abs(out.loss.item() - ref_out.loss.item()) < 1e-5
    for name, g in grads.items():
        assert _rel(g, ref_grads[name]) < 1e-4, name


def test_revert_restores_rope_and_patched_models_can_be_freed() -> None:
    import gc
    import weakref

    from transformers.models.llama import modeling_llama

    original = modeling_llama.apply_rotary_pos_emb
    model = tiny_model("llama")
    apply_greta(model)
    assert modeling_llama.apply_rotary_pos_emb is not original
    revert_greta(model)
    assert model.config._attn_implementation == "sdpa"
    assert modeling_llama.apply_rotary_pos_emb is not original  # family-wide until...
    revert_greta("llama")
    assert modeling_llama.apply_rotary_pos_emb is original
    apply_greta(model)
    alive = weakref.ref(model)
    del model
    gc.collect()
    assert alive() is None  # apply_greta keeps no reference to the model
