#!/usr/bin/env python3
"""Eager decode, vanilla against ``apply_greta(model)``, interleaved in one process.

``bench/hf_llama.py`` times each variant in its own process, one after the other. On a
shared host the eager decode (host-bound at batch 1) moves by 30% or more between those
processes, more than the difference being measured. Here one model decodes in both forms
in alternating rounds: ``apply_greta(model)`` patches the instance, ``revert_greta`` undoes
it (the instance and the family's RoPE function), so a drift of the host reaches both forms
alike and each round gives one GRETA / vanilla ratio. The result is the median of the
per-round ratios (the rule of ``bench/binding_overhead.py``), with every round kept.

Each form first generates once with the timed length, so every KV-cache length has been
seen (SDPA's cuDNN backend builds a plan per new length) and every GRETA kernel compiled.
The implementations each form ran are recorded: GRETA's must name its kernels, vanilla's
none (a revert that left a patch behind would show there).

    python bench/decode_ab.py --out bench/results/h100/decode_ab      # H100, ~1 minute
    python bench/decode_ab.py --tiny --out decode_ab_smoke             # CPU, seconds
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hf_llama  # the model shapes, the seeded model and prompt

FORMS = ("vanilla", "greta")


def _set_form(model: Any, form: str) -> None:
    from greta_core.transformers import apply_greta, revert_greta

    if form == "greta":
        apply_greta(model)
    else:
        revert_greta(model)
        revert_greta("llama")  # the family-wide RoPE function


def _decode(model: Any, prompt: Any, tokens: int, device: str) -> float:
    """Tokens/s of one greedy generate of `tokens` new tokens."""
    import torch

    kw = dict(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        hf_llama._sync(device)
        t0 = time.perf_counter()
        out = model.generate(prompt, **kw)
        hf_llama._sync(device)
    return (out.shape[1] - prompt.shape[1]) / (time.perf_counter() - t0)


def measure(shape_name: str, rounds: int, tokens: int, prompt_len: int, device: str) -> dict:
    import torch

    from greta_core import observe

    shape = hf_llama.SHAPES[shape_name]
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = hf_llama._build(shape, "vanilla", device, dtype)
    model.eval()
    prompt = hf_llama._tokens(shape, 1, prompt_len, 3, device)
    implementations: dict[str, dict[str, str]] = {}
    for form in FORMS:  # warm: every cache length once, every kernel compiled
        _set_form(model, form)
        observe.reset()
        _decode(model, prompt, tokens, device)
        implementations[form] = observe.implementations_seen()
    per_round = []
    for i in range(rounds):
        order = FORMS if i % 2 == 0 else FORMS[::-1]
        rates = {}
        for form in order:
            _set_form(model, form)
            rates[form] = _decode(model, prompt, tokens, device)
        per_round.append({"order": list(order), **{f: round(r, 2) for f, r in rates.items()}})
    _set_form(model, "vanilla")
    ratios = [r["greta"] / r["vanilla"] for r in per_round]
    return {
        "shape": shape_name,
        "tokens": tokens,
        "prompt": prompt_len,
        "rounds": per_round,
        "vanilla_tok_s": statistics.median(r["vanilla"] for r in per_round),
        "greta_tok_s": statistics.median(r["greta"] for r in per_round),
        "greta_vs_vanilla": round(statistics.median(ratios), 3),
        "greta_vs_vanilla_min": round(min(ratios), 3),
        "greta_vs_vanilla_max": round(max(ratios), 3),
        "implementations": implementations,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="result dir (overwritten)")
    parser.add_argument("--shape", default="llama-1b-8l", choices=list(hf_llama.SHAPES))
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=32, help="new tokens per generate")
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens")
    parser.add_argument("--tiny", action="store_true", help="CPU smoke test (tiny shape)")
    args = parser.parse_args(argv)

    import torch

    from greta_core.bench.metadata import header
    from greta_core.bench.report import write_csv, write_json

    device = "cpu" if args.tiny or not torch.cuda.is_available() else "cuda"
    shape = "tiny" if args.tiny else args.shape
    result = measure(shape, args.rounds, args.tokens, args.prompt, device)
    doc = {**header("decode_ab", device, "bench/decode_ab.py", argv, args.out), **result}
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "decode_ab.json", doc)
    rows = [
        {"round": i, "order": ">".join(r["order"]), "vanilla_tok_s": r["vanilla"],
         "greta_tok_s": r["greta"], "greta_vs_vanilla": r["greta"] / r["vanilla"]}
        for i, r in enumerate(result["rounds"])
    ]  # fmt: skip
    write_csv(args.out / "decode_ab.csv", rows, tuple(rows[0]))
    print(
        f"{shape}: vanilla {result['vanilla_tok_s']:.1f} tok/s, greta {result['greta_tok_s']:.1f}"
        f" tok/s, greta/vanilla median {result['greta_vs_vanilla']}"
        f" ({result['greta_vs_vanilla_min']}-{result['greta_vs_vanilla_max']}"
        f" over {len(result['rounds'])} rounds)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
