"""Block-size rules: how a config entry and a problem size give the constexpr block sizes.

Both the launch plans (``greta_core.ops``) and the AOT specs (``greta_core.kernels``) use
them, so the two always agree.

Row ops (norms, softmax): a row op reads its whole row into registers when ``next_pow2(N) <= MAX_BLOCK_N`` (one
read and one write per element); longer rows loop over ``LOOP_BLOCK_N`` chunks. Both the
launch plans (``greta_core.ops._rows``) and the AOT specs (``greta_core.kernels``) use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Smallest block: keeps a warp's vector loads full even for very short rows.
MIN_BLOCK_N = 16


def _next_pow2(n: int) -> int:
    # Shifts and ors only: also works on torch.compile's symbolic sizes.
    n -= 1
    for shift in (1, 2, 4, 8, 16, 32):
        n |= n >> shift
    return n + 1


def row_block(config: Mapping[str, Any], n_cols: int) -> tuple[int, bool]:
    """(BLOCK_N, ONE_PASS) for rows of `n_cols` under `config`."""
    block = max(MIN_BLOCK_N, _next_pow2(max(n_cols, 1)))
    if block <= config["MAX_BLOCK_N"]:
        return block, True
    return config["LOOP_BLOCK_N"], False


# Row widths of the models GRETA precompiles the norms for: a norm's row is the model's
# hidden size, a per-head q/k norm's head_dim or a low-rank projection's rank. Head dims 64
# (GPT-2, BERT), 128 (Llama, Qwen3), 256 (Gemma 3); ranks 512 (DeepSeek-V3 kv) and 1536 (its
# q); hidden sizes 768 (GPT-2, BERT-base), 1024 (Qwen3-0.6B), 1536 (Qwen2.5-1.5B), 2048
# (Llama-3.2-1B), 2560 (Qwen3-4B), 3072 (Llama-3.2-3B), 3584 (Qwen2.5-7B, Gemma-2-9B), 4096
# (Llama-3.1-8B, Mistral-7B), 5120 (Qwen2.5-14B/32B), 7168 (DeepSeek-V3), 8192
# (Llama-3.1-70B), 16384 (Llama-3.1-405B). All are multiples of 16, so the norms precompile
# the "aligned" int specialisation only (``kernel_wheels.aot.precompiled_int_variants``). A
# width whose block is not among these (on gfx942: 1-32 or over 16384 columns) or an odd width
# compiles on first use (``observe.kernel_code_counts`` counts those compiles).
MODEL_ROW_WIDTHS: tuple[int, ...] = (
    64, 128, 256, 512, 768, 1024, 1536, 2048, 2560, 3072, 3584, 4096, 5120, 7168, 8192, 16384,
)  # fmt: skip

# Row ops whose rows are a model width (the norms, forward and backward): their kernel wheel
# holds the blocks the table maps MODEL_ROW_WIDTHS to. Softmax rows are sequence or
# vocabulary lengths (any width): every block the table can pick, both int specialisations.
MODEL_WIDTH_OPS: frozenset[str] = frozenset({"rms_norm", "add_rms_norm", "layer_norm"})


def _family(op: str) -> str:
    return op.removesuffix("_bwd")


def aot_widths(op: str, arch: str) -> list[int]:
    """The row widths whose blocks `op`'s precompiled specs cover on `arch`."""
    if _family(op) in MODEL_WIDTH_OPS:
        return list(MODEL_ROW_WIDTHS)
    from greta_core import configs

    config = configs.lookup(op, arch, {})
    widths = []
    # From the smallest block up: a block the wheel lacks is a JIT compile on first call.
    block = MIN_BLOCK_N
    while block <= config["MAX_BLOCK_N"]:
        widths.append(block)
        block *= 2
    widths.append(config["MAX_BLOCK_N"] * 2)
    return widths


def aot_variants(op: str, arch: str) -> list[tuple[int, bool, dict[str, Any]]]:
    """(BLOCK_N, ONE_PASS, launch options) the table picks for each of `aot_widths`, each once,
    in width order: the row ops' AOT specs."""
    from greta_core import configs

    out: list[tuple[int, bool, dict[str, Any]]] = []
    for n in aot_widths(op, arch):
        cfg = configs.lookup(op, arch, {"N": n})
        block_n, one_pass = row_block(cfg, n)
        variant = (block_n, one_pass, configs.launch_options(cfg, arch))
        if variant not in out:
            out.append(variant)
    return out


def rope_blocks(config: Mapping[str, Any], n_heads: int, head_dim: int) -> tuple[int, int]:
    """(BLOCK_H, BLOCK_HALF) of RoPE: a program's tile is capped at ELEMS elements, so small
    head counts get one program per token."""
    block_half = _next_pow2(max(head_dim // 2, 1))
    block_h = max(1, min(_next_pow2(n_heads), config["ELEMS"] // (2 * block_half)))
    return block_h, block_half


def kv_cache_blocks(config: Mapping[str, Any], n_new: int, head_dim: int) -> tuple[int, int]:
    """(BLOCK_T, BLOCK_D) of kv_cache_append: a program's tile is capped at ELEMS elements."""
    block_d = _next_pow2(max(head_dim, 1))
    block_t = max(1, min(_next_pow2(max(n_new, 1)), config["ELEMS"] // block_d))
    return block_t, block_d
