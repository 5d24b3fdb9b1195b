"""Rewrite references to greta_install's flat module paths into its layered ones.

greta_install's modules moved into folders (detection/, environment/, locks/, plan/,
install/; docs/en/architecture.md). A branch made before the move still names the old
paths; after merging it, run this from the repository root to rewrite every dotted path
(`greta_install.lockfile`), file path (`greta_install/lockfile.py`) and
`from greta_install import lockfile` in the tracked text files, then review `git diff`:

    python3 scripts/relayout_paths.py

`MOVES` is the map of the move. bench/results/ keeps the paths its runs used.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

# Old module (dotted, under greta_install) -> its new place.
MOVES = {
    "system_view": "detection.system_view",
    "pci_ids": "detection.pci_ids",
    "parsers": "detection.parsers",
    "data": "detection.data",
    "evidence": "detection.evidence",
    "detect": "detection.detect",
    "snapshot": "detection.snapshot",
    "tools": "environment.tools",
    "wheelfiles": "environment.wheelfiles",
    "envfix": "environment.envfix",
    "bytecode": "environment.bytecode",
    "matrix": "locks.matrix",
    "routing": "locks.routing",
    "lockfile": "locks.lockfile",
    "lockgen": "locks.lockgen",
    "pylock": "locks.pylock",
    "vendor_index": "locks.vendor_index",
    "docsgen": "locks.docsgen",
    "plan": "plan.install_plan",
    "noop": "plan.noop",
    "planning": "install.prepare",
    "installer": "install.installer",
    "transaction": "install.transaction",
    "pipeline": "install.pipeline",
    "steps": "install.steps",
    "step_hashes": "install.step_hashes",
    "step_kernels": "install.step_kernels",
    "step_smoke": "install.step_smoke",
    "hashrecord": "install.hashrecord",
    "kernel_build": "install.kernel_build",
    "smoke": "install.smoke",
    "smoke_child": "install.smoke_child",
    "commands.install_only": "install.only",
    "commands.doctor_cluster": "doctor.cluster_run",
    "commands.doctor_collective": "doctor.collective_run",
}


# Longest first, and never followed by an identifier character: `plan` must not eat
# `planning`.
OLD_SORTED = sorted(MOVES, key=len, reverse=True)
DOT = re.compile(
    r"\bgreta_install\.(" + "|".join(re.escape(o) for o in OLD_SORTED) + r")(?![A-Za-z0-9_])"
)
SLASH = re.compile(
    r"\bgreta_install/("
    + "|".join(re.escape(o.replace(".", "/")) for o in OLD_SORTED)
    + r")(\.py|/|(?![A-Za-z0-9_]))"
)


def sub_dot(m: re.Match[str]) -> str:
    if m.group(1) == "plan":
        rest = m.string[m.end() :]
        # `plan` is an old module and a new package: leave what already names the package.
        if re.match(r"\.(install_plan|noop)\b|\s+import\s+\(?\s*(install_plan|noop)\b", rest):
            return m.group(0)
    return "greta_install." + MOVES[m.group(1)]


def sub_slash(m: re.Match[str]) -> str:
    old = m.group(1).replace("/", ".")
    if old == "plan" and m.group(2) == "/":
        return m.group(0)
    return "greta_install/" + MOVES[old].replace(".", "/") + m.group(2)


FROM = re.compile(
    r"^(?P<ind>[ \t]*)from greta_install(?P<sub>\.commands)? import (?P<names>[^()\n#]+?)(?P<tail>[ \t]*(#.*)?)$",
    re.M,
)


def sub_from(m: re.Match[str]) -> str:
    """`from greta_install import a, b as c`: one line per new package, local names kept."""
    sub = m.group("sub") or ""
    prefix = sub[1:] + "." if sub else ""
    items = [x.strip() for x in m.group("names").split(",") if x.strip()]
    groups: dict[str, list[str]] = {}
    for item in items:
        name, _, alias = item.partition(" as ")
        name, alias = name.strip(), alias.strip()
        old = prefix + name
        if old in MOVES:
            pkg, _, base = MOVES[old].rpartition(".")
            pkg = "greta_install." + pkg
            local = alias or name
            text = base if base == local else f"{base} as {local}"
        else:
            pkg = "greta_install" + sub
            text = item
        groups.setdefault(pkg, []).append(text)
    if list(groups) == ["greta_install" + sub]:
        return m.group(0)
    lines = []
    for i, (pkg, texts) in enumerate(groups.items()):
        tail = m.group("tail") if i == 0 else ""
        lines.append(f"{m.group('ind')}from {pkg} import {', '.join(texts)}{tail}")
    return "\n".join(lines)


def rewrite(text: str) -> str:
    text = DOT.sub(sub_dot, text)
    text = SLASH.sub(sub_slash, text)
    text = FROM.sub(sub_from, text)
    return text


KEEP = ("pyproject.toml", "scripts/relayout_paths.py", "tests/test_layers.py")
TEXT = (".py", ".md", ".toml", ".sh", ".txt", ".csv", ".json", ".cfg", ".ini", ".yml", ".yaml")


def main() -> None:
    tracked = subprocess.run(["git", "ls-files"], capture_output=True, text=True, check=True)
    changed = 0
    for name in tracked.stdout.split():
        # bench/results keeps what its runs named; pyproject's package list is already new;
        # this script and its test name the old paths on purpose.
        if name.startswith("bench/results/") or name in KEEP:
            continue
        if not name.endswith(TEXT) and not name.startswith(".ci/"):
            continue
        path = Path(name)
        try:
            old = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        new = rewrite(old)
        if new != old:
            path.write_text(new, encoding="utf-8")
            changed += 1
    print("rewrote", changed, "files")


if __name__ == "__main__":
    main()
