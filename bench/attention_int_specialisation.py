"""What attention's kernels lose by not specialising the lengths and head counts on 16-divisibility.

``kernels/attention.py`` lists ``UNALIGNED_INTS`` (Sq, Skv, H_Q, GROUP) in each attention
kernel's ``do_not_specialize_on_alignment``, so a kernel wheel's one entry per kind of call
serves every length and head count. This compiles chosen wheel specs for an arch (no GPU:
``greta_core.kernel_wheels.aot``) twice at all-16-divisible ints (a 2048-token, 32-head,
group-4 call): as shipped, and with Triton's default specialisation of every int (what the
kernels did before, when such a call had its own entry). It reports, per spec, the machine
code's instruction count, the instructions whose counts differ, the registers and spills,
so the cost is read from the code, not assumed.

    python bench/attention_int_specialisation.py --arch gfx942 --out bench/results/kernel_build/attention_int_specialisation_gfx942

Writes ``<out>.json`` (metadata + rows) and ``<out>.csv``. Runs without TRITON_INTERPRET.
"""

from __future__ import annotations

import argparse
import collections
import csv
import json
import os
import platform
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["TRITON_INTERPRET"] = "0"  # before Triton is imported: compile, not interpret

from greta_core.bench.metadata import command_line, git_commit  # noqa: E402

# Training's and inference's calls at head dim 128 in bf16 (GQA): the prefill, the decode
# step, and the backward's three kernels.
DEFAULT_SPECS = (
    "attention_fwd_kernel[bf16,bf16,bf16,bf16,bf16,bf16,fp32;HEAD_DIM=128,BLOCK_M=128,"
    "BLOCK_N=64,CAUSAL=True,HAS_LENS=False,UPCAST=False;ragged=]",
    "attention_fwd_kernel[bf16,bf16,bf16,bf16,bf16,bf16,fp32;HEAD_DIM=128,BLOCK_M=16,"
    "BLOCK_N=64,CAUSAL=False,HAS_LENS=False,UPCAST=False,Sq=1;ragged=]",
    "attention_bwd_delta_kernel[bf16,bf16,fp32;HEAD_DIM=128,UPCAST=False,BLOCK_M=64;ragged=]",
    "attention_bwd_dkdv_kernel[bf16,bf16,bf16,bf16,fp32,fp32,bf16,bf16;HEAD_DIM=128,"
    "CAUSAL=True,UPCAST=False,BLOCK_M=64,BLOCK_N=64;ragged=]",
    "attention_bwd_dq_kernel[bf16,bf16,bf16,bf16,fp32,fp32,bf16;HEAD_DIM=128,CAUSAL=True,"
    "UPCAST=False,BLOCK_M=64,BLOCK_N=64;ragged=]",
)
FIELDS = ("arch", "spec", "instructions_shipped", "instructions_specialised",
          "registers_shipped", "registers_specialised", "spills_shipped",
          "spills_specialised", "differing")  # fmt: skip
_ASM = {"hip": "amdgcn", "cuda": "ptx"}


def mnemonics(text: str, asm: str) -> collections.Counter[str]:
    """Instruction mnemonics of an AMDGCN or PTX listing (directives, labels, comments out)."""
    found: collections.Counter[str] = collections.Counter()
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in ".;/$@{}" or line.endswith(":") or line.startswith("//"):
            continue
        word = line.split()[0].rstrip(";")
        if asm == "amdgcn" and not re.fullmatch(
            r"[sv]_\w+|global_\w+|buffer_\w+|ds_\w+|flat_\w+|scratch_\w+", word
        ):
            continue
        found[word] += 1
    return found


def registers(compiled: Any, text: str, asm: str) -> tuple[int, int]:
    """(vector registers per thread, spilled ones) as the backend reports them."""
    if asm == "amdgcn":
        vgpr = re.search(r"\.vgpr_count:\s+(\d+)", text)
        spill = re.search(r"\.vgpr_spill_count:\s+(\d+)", text)
        return int(vgpr.group(1)) if vgpr else -1, int(spill.group(1)) if spill else -1
    regs = re.findall(r"\.reg \.\w+\s+%\w+<(\d+)>", text)
    return sum(int(r) for r in regs), 0


def compile_both(
    spec: Any, arch: str, work: Path, unaligned: tuple[str, ...] | None = None
) -> dict[str, Any]:
    """`unaligned`: compile "shipped" with these ints unspecialised instead of the kernel's
    own list (a candidate list, measured before it is shipped)."""
    from triton.runtime.jit import JITFunction

    from greta_core.kernel_wheels import aot

    names = list(spec.kernel.arg_names)
    ints = aot.int_args_for(spec, aot.CASE)  # every int 16-divisible: the aligned call
    args = [
        spec.constexprs[n] if n in spec.constexprs else aot._stand_in(n, spec.signature[n], ints)
        for n in names
    ]
    out: dict[str, Any] = {}
    shipped_kernel = spec.kernel
    if unaligned is not None:
        shipped_kernel = JITFunction(spec.kernel.fn, do_not_specialize_on_alignment=unaligned)
    for label, kernel in (
        ("shipped", shipped_kernel),
        ("specialised", JITFunction(spec.kernel.fn)),
    ):
        with aot.compiling_for(arch, work / label):
            kernel.device_caches.clear()
            compiled = kernel.warmup(*args, grid=(1,), **dict(spec.options))
        asm = _ASM[aot.target_for(arch).backend]
        text = compiled.asm[asm]
        out[label] = (mnemonics(text, asm), *registers(compiled, text, asm))
    shipped, specialised = out["shipped"][0], out["specialised"][0]
    differing = {
        m: [shipped.get(m, 0), specialised.get(m, 0)]
        for m in sorted(set(shipped) | set(specialised))
        if shipped.get(m, 0) != specialised.get(m, 0)
    }
    return {
        "arch": arch,
        "spec": spec.name,
        "instructions_shipped": sum(shipped.values()),
        "instructions_specialised": sum(specialised.values()),
        "registers_shipped": out["shipped"][1],
        "registers_specialised": out["specialised"][1],
        "spills_shipped": out["shipped"][2],
        "spills_specialised": out["specialised"][2],
        "differing": json.dumps(differing, separators=(",", ":")),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="gfx942")
    parser.add_argument("--specs", default=",".join(DEFAULT_SPECS).replace("],", "]|"),
                        help="'|'-separated wheel spec names (default: bf16 D128 GQA)")  # fmt: skip
    parser.add_argument(
        "--unaligned",
        default=None,
        help="comma list of ints to leave unspecialised in place of the kernels' own lists",
    )
    parser.add_argument("--out", type=Path, required=True, help="path stem of the .json/.csv")
    args = parser.parse_args()
    import triton

    from greta_core.kernel_wheels import aot

    wanted = [s for s in args.specs.split("|") if s]
    unaligned = None if args.unaligned is None else tuple(filter(None, args.unaligned.split(",")))
    specs = {
        s.name: s for f in aot.discover(args.arch, ["attention", "attention_bwd"]) for s in f.specs
    }
    missing = [w for w in wanted if w not in specs]
    if missing:
        print(f"no such spec for {args.arch}: {missing}", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="greta-intspec-") as work:
        for name in wanted:
            rows.append(
                compile_both(specs[name], args.arch, Path(work) / str(len(rows)), unaligned)
            )
            print(json.dumps(rows[-1]), flush=True)
    result = {
        "bench": "attention_int_specialisation",
        "command": command_line("bench/attention_int_specialisation.py", sys.argv[1:], args.out),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": git_commit()["commit"],
        "machine": platform.machine(),
        "python": platform.python_version(),
        "triton": triton.__version__,
        "unaligned": "the kernels' own" if unaligned is None else ",".join(unaligned),
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    with args.out.with_suffix(".csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {args.out.with_suffix('.json')} and .csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
