"""Gated MLP forwards: ``down(act(gate(x)) * up(x))`` with the gating fused in one kernel
(``torch.ops.greta.swiglu`` for SiLU models, ``torch.ops.greta.geglu`` for Gemma's tanh GELU).
"""

from __future__ import annotations

import torch

from greta_core.torch._common import consume_inputs
from greta_core.torch._declared import ops as greta_ops
from greta_core.transformers._fallback import fall_back

# transformers' ACT2FN names -> the GRETA op computing act(gate) * up.
GATED_OPS = {
    "silu": "swiglu",
    "swish": "swiglu",
    "gelu_pytorch_tanh": "geglu",
    "gelu_tanh": "geglu",
}


def activation_name(module: torch.nn.Module) -> str:
    config = getattr(module, "config", None)
    name = getattr(config, "hidden_act", None) or getattr(config, "hidden_activation", "")
    return str(name)


def glu_mlp_forward(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    act = activation_name(self)
    op = GATED_OPS.get(act)
    gate, up = self.gate_proj(x), self.up_proj(x)
    if op is None:
        fall_back("swiglu", "transformers", f"activation {act!r} has no fused GRETA kernel")
        return self.down_proj(self.act_fn(gate) * up)
    if torch.compiler.is_compiling():
        return self.down_proj(getattr(torch.ops.greta, op)(gate, up))
    # gate and up are this forward's own: the backward may write their gradients over them.
    with consume_inputs():
        hidden = getattr(greta_ops, op)(gate, up)
    return self.down_proj(hidden)
