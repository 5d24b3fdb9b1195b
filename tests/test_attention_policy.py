"""apply_greta's attention in training: the arch's config table decides (SDPA where its
backward is faster), ``attention="always"`` overrides it, inference keeps GRETA's kernel."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from _kernel_testing import DEVICE, ON_GPU  # noqa: E402

from greta_core import configs, observe  # noqa: E402
from greta_core.transformers import (  # noqa: E402
    _fallback,
    apply_greta,
    revert_greta,
)
from greta_core.transformers import apply as apply_module  # noqa: E402
from greta_core.transformers import attention as attn  # noqa: E402


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("GRETA_TRITON_ON_CPU", raising=False)
    monkeypatch.setattr(_fallback, "_warned", set())
    yield
    for key in apply_module.patched_targets():
        revert_greta(key)


@pytest.mark.parametrize(
    ("arch", "backend"), [("sm_90", "sdpa"), ("gfx942", "greta"), ("gfx1100", "greta")]
)
def test_training_attention_backend_per_arch(arch: str, backend: str) -> None:
    assert configs.lookup("attention_training", arch)["backend"] == backend


def test_cpu_never_sends_training_to_sdpa_by_table() -> None:
    q = torch.randn(1, 2, 4, 16, requires_grad=True)
    assert not attn._sdpa_trains_faster(q)


def _tiny_llama(dtype: torch.dtype):
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=64,
        max_position_embeddings=64, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM._from_config(config, attn_implementation="sdpa")
    return model.to(device=DEVICE, dtype=dtype)


@pytest.mark.parametrize(("flag", "name"), [(True, attn.NAME), ("always", attn.NAME_ALWAYS)])
def test_model_mode_picks_the_registered_implementation(flag, name) -> None:
    model = _tiny_llama(torch.float32)
    apply_greta(model, attention=flag)
    assert model.config._attn_implementation == name
    revert_greta(model)
    assert model.config._attn_implementation == "sdpa"


@pytest.mark.skipif(not ON_GPU, reason="GPU test: the table's choice applies to GPU training")
@pytest.mark.parametrize("flag", [True, "always"])
def test_gpu_training_attention_follows_table_or_flag(flag) -> None:
    from greta_core.arch import device_arch

    model = _tiny_llama(torch.bfloat16)
    apply_greta(model, attention=flag)
    model.train()
    ids = torch.randint(1, 64, (2, 16), device=DEVICE)
    observe.reset()
    model(ids, labels=ids).loss.backward()
    table_says_sdpa = configs.lookup("attention_training", device_arch())["backend"] == "sdpa"
    want = "torch-sdpa" if flag is True and table_says_sdpa else "triton"
    assert observe.implementations_seen()["attention"] == want
    # Inference runs GRETA's kernel whatever the training choice.
    model.eval()
    observe.reset()
    with torch.no_grad():
        model(ids)
    assert observe.implementations_seen()["attention"] == "triton"
