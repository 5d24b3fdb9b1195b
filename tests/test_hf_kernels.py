"""GRETA's layers through Hugging Face's `kernels` (kernelize with GRETA's local layer
repository, no hub access), and patched forwards free of transformers' deprecations."""

from __future__ import annotations

import copy
import importlib
import os
import warnings

import pytest
import torch
import transformers
from kernels import Mode

from greta_core import observe
from greta_core.hub import REPOSITORY, kernelize_greta, layer_mapping
from greta_core.transformers import apply_greta, revert_greta

TINY = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, vocab_size=128, max_position_embeddings=64, head_dim=16,
)  # fmt: skip


def _tiny(family: str) -> torch.nn.Module:
    config = transformers.AutoConfig.for_model(family, **TINY)
    if family == "gemma":
        config.hidden_act = "gelu_pytorch_tanh"
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")


def _ids() -> torch.Tensor:
    return torch.randint(1, 128, (2, 12), generator=torch.Generator().manual_seed(1))


@pytest.fixture(autouse=True)
def _reference_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRETA_TRITON_ON_CPU", raising=False)  # the ops' torch references


def test_the_local_repository_offers_every_layer_on_every_device() -> None:
    mapping = layer_mapping()
    assert set(mapping) == {"RMSNorm", "GatedMLP", "rotary_pos_emb", "ForCausalLM"}
    for devices in mapping.values():
        assert set(devices) == {"cpu", "cuda", "rocm"}
        for repo in devices.values():
            assert repo.load().__module__ == "greta_core.hub"  # loaded from the local path
    assert (REPOSITORY / "build" / "torch-cpu" / "metadata.json").is_file()


@pytest.mark.parametrize("family", ["llama", "gemma"])
def test_kernelize_inference_matches_the_unpatched_model(family: str) -> None:
    model = _tiny(family).eval()
    plain = copy.deepcopy(model)
    kernelize_greta(model, mode=Mode.INFERENCE, device="cpu")
    # `kernels` registers the repository's module under its metadata id: it must never
    # take the name of GRETA's own `greta` package.
    assert importlib.import_module("greta").__file__.endswith(os.path.join("greta", "__init__.py"))
    norm, mlp = model.model.norm, model.model.layers[0].mlp
    assert type(norm.forward.__self__) is type(plain.model.norm)
    assert norm.forward.__func__.__qualname__ == "RMSNorm.forward"
    assert mlp.forward.__func__.__qualname__ == "GatedMLP.forward"
    assert model.forward.__func__.__qualname__ == "ForCausalLM.forward"
    assert model.config._attn_implementation == "greta"
    observe.reset()
    with torch.no_grad():
        got, want = model(_ids()).logits, plain(_ids()).logits
    assert observe.last_implementation("rms_norm") == "reference-torch"
    assert observe.last_implementation("attention") == "reference-torch"
    gated = "geglu" if family == "gemma" else "swiglu"
    assert observe.last_implementation(gated) == "reference-torch"
    # fp32, the same math in another order: a few ulps of the logits' scale.
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_kernelize_training_matches_loss_and_gradients() -> None:
    model = _tiny("llama").train()
    plain = copy.deepcopy(model)
    kernelize_greta(model, mode=Mode.TRAINING, device="cpu")
    assert model.forward.__func__.__qualname__ == "ForCausalLM.forward"
    ids = _ids()
    losses = []
    observe.reset()
    for m in (model, plain):
        m.zero_grad()
        out = m(ids, labels=ids)
        out.loss.backward()
        losses.append(out.loss.detach())
        if m is model:  # the fused loss: the logits never exist in training
            assert out.logits is None
            assert observe.last_implementation("linear_cross_entropy") == "reference-torch"
            assert observe.last_implementation("attention") == "reference-torch"
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(model.named_parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_an_unknown_model_family_is_a_clear_error() -> None:
    class Odd(torch.nn.Module):
        config = None

    with pytest.raises(ValueError, match="not one GRETA's layers were checked against"):
        kernelize_greta(Odd(), mode=Mode.INFERENCE, device="cpu")


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma"])
def test_apply_greta_models_raise_no_future_warning(family: str) -> None:
    """With the transformers CI pins (pyproject's test extra), a deprecated argument passed
    by GRETA's patched forwards (`past_key_values=` where transformers now says `cache`)
    shows as a FutureWarning: any is an error here, as it is for the unpatched model."""
    model = _tiny(family)
    ids = _ids()
    apply_greta(model)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            warnings.simplefilter("error", DeprecationWarning)
            model.train()
            model(ids, labels=ids).loss.backward()
            model.eval()
            with torch.no_grad():
                model(ids, use_cache=True)
                model.generate(ids, max_new_tokens=3, do_sample=False)
    finally:
        revert_greta(model)
        revert_greta(family)  # the family-wide rope patch


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3", "gemma"])
def test_every_family_takes_the_causal_lm_layer(family: str) -> None:
    """`kernels` checks a layer's forward against the class's (argument count and kinds):
    the ForCausalLM layer must pass for every family GRETA supports."""
    model = kernelize_greta(_tiny(family).train(), mode=Mode.TRAINING, device="cpu")
    assert model.forward.__func__.__qualname__ == "ForCausalLM.forward"
    ids = _ids()
    out = model(ids, labels=ids)
    assert out.logits is None and torch.isfinite(out.loss)
