"""Compare the AOT specs of two GRETA trees: what a migration to a declaration must keep.

Each spec is reduced to (kernel, signature in order, constexprs, options, matrix units, and,
for a spec compiled at its case's ints, which ints are 16-divisible); its name is left out
(derived specs are named after the kernel). Dump each tree, then compare:

    git archive OLD greta_core | tar -x -C <old>
    PYTHONPATH=<old> python bench/aot_specs_diff.py dump --out old.json --modules vec_add,rope
    PYTHONPATH=.     python bench/aot_specs_diff.py dump --out new.json --modules vec_add,rope
    python bench/aot_specs_diff.py compare old.json new.json

``compare`` prints one line per (arch, module) and exits 1 when any differs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ARCHS = ("gfx942", "gfx1100", "gfx1201", "sm_90", "sm_80", "gfx90a")


def _case_ints(spec: Any) -> list[Any]:
    """[the ints' divisibility] for a spec with its case's ints; [] otherwise (as before)."""
    divisible = getattr(spec, "int_divisible", None)
    return [] if divisible is None else [sorted(divisible.items())]


def dump(modules: list[str], archs: list[str]) -> dict[str, list[str]]:
    """'arch/module' -> the sorted canonical specs (JSON strings)."""
    from greta_core.kernel_wheels.aot import discover

    out = {}
    for arch in archs:
        for found in discover(arch, modules):
            out[f"{arch}/{found.module}"] = sorted(
                json.dumps([
                    s.kernel.__name__, list(s.signature.items()), sorted(s.constexprs.items()),
                    sorted(s.options.items()), s.uses_matrix_units,
                    *_case_ints(s),
                ], default=str)
                for s in found.specs
            )  # fmt: skip
    return out


def compare(old: dict[str, list[str]], new: dict[str, list[str]]) -> list[str]:
    """One line per key; a line starting with DIFF for each that differs."""
    lines = []
    for key in sorted(old.keys() | new.keys()):
        a, b = old.get(key, []), new.get(key, [])
        if a == b:
            lines.append(f"same  {key}: {len(a)} specs")
        else:
            lines.append(
                f"DIFF  {key}: {len(a)} -> {len(b)} specs, "
                f"{len(set(a) - set(b))} only before, {len(set(b) - set(a))} only after"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("--out", type=Path, required=True)
    d.add_argument("--modules", required=True, help="kernel modules, comma-separated")
    d.add_argument("--archs", default=",".join(ARCHS))
    c = sub.add_parser("compare")
    c.add_argument("old", type=Path)
    c.add_argument("new", type=Path)
    args = parser.parse_args(argv)
    if args.cmd == "dump":
        specs = dump(args.modules.split(","), args.archs.split(","))
        args.out.write_text(json.dumps(specs, indent=1) + "\n")
        print(f"{sum(map(len, specs.values()))} specs in {len(specs)} (arch, module) pairs")
        return 0
    lines = compare(json.loads(args.old.read_text()), json.loads(args.new.read_text()))
    print("\n".join(lines))
    return 1 if any(line.startswith("DIFF") for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
