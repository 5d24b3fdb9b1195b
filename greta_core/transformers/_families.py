"""The model families apply_greta knows: where transformers keeps their classes."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True)
class Family:
    model_type: str  # config.model_type, and the modeling module's name
    prefix: str  # class name prefix: LlamaRMSNorm, LlamaMLP, ...
    norm_weight_offset: bool = False  # Gemma's norms scale by (1 + weight)

    def module(self) -> ModuleType:
        mt = self.model_type
        return importlib.import_module(f"transformers.models.{mt}.modeling_{mt}")

    def cls(self, suffix: str) -> type | None:
        return getattr(self.module(), self.prefix + suffix, None)


FAMILIES: dict[str, Family] = {
    f.model_type: f
    for f in (
        Family("llama", "Llama"),
        Family("mistral", "Mistral"),
        Family("qwen2", "Qwen2"),
        Family("qwen3", "Qwen3"),
        Family("gemma", "Gemma", norm_weight_offset=True),
    )
}
