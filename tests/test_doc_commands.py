"""Every shell command in README.md and docs/en/install.md, checked as typed (issue 28).

Each command of a ```bash block (continuation lines joined, split at `&&`, comments
dropped) is checked by what it is:

- `greta ...` (bare, or `.venv/bin/greta`): parsed by greta's own argument parser, so a
  renamed option or an invalid choice fails here. Parse only: most need a GPU, the network,
  or minutes (install, kernels, bench, build-kernels, doctor); the offline, fast ones
  (`greta detect`, `greta env`, `greta install --dry-run ... --python 3.12`, `--help`) also run;
- `python FILE.py ...`: the file exists and its `--help` works (parse only: they run GPU
  benchmarks or minutes-long builds);
- `python -m MODULE ...`: the module exists and its `--help` works;
- `pip install '.[EXTRA]'` / `uv pip install ... '.[EXTRA]'`: the extra exists in pyproject;
- the venv and test commands (`python3 -m venv`, `uv venv`, `pytest`, activate) are what
  CI itself runs (.ci/run) and are checked for the right paths only.

The Python snippets run in tests/test_doc_snippets.py.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("README.md", "docs/en/install.md")
FENCE = re.compile(r"^```bash[ \t]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
# Placeholders the pages use for a user's own paths and hosts.
PLACEHOLDER = re.compile(r"DIR|FILE|/shared/|~/|your\.host|node1-")
RUN_FAST = {"detect", "env"}  # offline, seconds, change nothing (as run here: see CHANGES)
# Options of those that change the environment running the tests: parsed, never run (`greta
# env --clear` would remove the test venv's persisted environment fixes).
CHANGES = {"--clear"}


def commands() -> list[tuple[str, list[str]]]:
    found: list[tuple[str, list[str]]] = []
    for page in PAGES:
        text = (ROOT / page).read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            first = text[: match.start()].count("\n") + 2
            body = match.group(1).replace("\\\n", " ")
            for offset, line in enumerate(body.splitlines()):
                for part in line.split("&&"):
                    argv = shlex.split(part, comments=True)
                    if argv:
                        found.append((f"{page}:{first + offset}", argv))
    return found


def _program(argv: list[str]) -> str:
    head = argv[0]
    while "=" in head and not head.startswith((".", "/")) and len(argv) > 1:  # VAR=1 cmd
        argv = argv[1:]
        head = argv[0]
    return Path(head).name


def _greta_parser():  # type: ignore[no-untyped-def]
    from greta.cli import build_parser

    return build_parser()


def test_commands_are_found() -> None:
    found = commands()
    pages = {where.split(":")[0] for where, _ in found}
    assert pages == set(PAGES)
    assert sum(_program(a) == "greta" for _, a in found) > 20


@pytest.mark.parametrize(
    ("where", "argv"), commands(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_command_as_typed(where: str, argv: list[str]) -> None:
    while "=" in argv[0] and not argv[0].startswith((".", "/")):
        argv = argv[1:]  # an environment assignment before the command
    program = argv[0] if argv[0] in (".", "source") else Path(argv[0]).name
    if program == "greta":
        _check_greta(where, argv[1:])
    elif program in ("python", "python3") and len(argv) > 1:
        _check_python(where, argv[1:])
    elif program in ("pip", "pip3") or (program == "uv" and argv[1:3] == ["pip", "install"]):
        _check_install(where, argv)
    elif program in (".", "source"):
        assert argv[1] == ".venv/bin/activate", where
    elif program == "uv":
        assert argv[1] in ("venv", "pip"), where
    elif program == "torchrun":
        # torchrun's own options, then the program it starts on every rank.
        assert argv[argv.index("-m") + 1] == "greta", where
        _check_greta(where, argv[argv.index("-m") + 2 :])
    elif program == "export":
        assert re.fullmatch(r"[A-Z_]+=\S+", argv[1]), where
    else:
        pytest.fail(f"{where}: no check for {program!r}: add one to tests/test_doc_commands.py")


def _check_greta(where: str, args: list[str]) -> None:
    parser = _greta_parser()
    args = [a for a in args if a not in ("[--json]", "[--snapshot", "DIR]")]
    args = [a.split("|")[0] for a in args]  # `smoke|standard|perf`: the first choice
    try:
        parser.parse_args(args)
    except SystemExit as exc:
        if exc.code not in (0, None):
            pytest.fail(f"{where}: greta {shlex.join(args)} does not parse")
    if not args:
        return
    if _runs(args):
        proc = subprocess.run(
            [sys.executable, "-m", "greta", *args], capture_output=True, text=True,
            cwd=ROOT, timeout=300, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, f"{where}: {proc.stderr[-500:]}"


def _runs(args: list[str]) -> bool:
    """Whether a documented `greta ARGS` is run here, not only parsed."""
    runnable = (args[0] in RUN_FAST and not CHANGES & set(args)) or (
        args[0] == "install" and "--dry-run" in args and "--python" in args
    )
    return runnable and not any(PLACEHOLDER.search(a) for a in args)


def test_commands_that_change_the_test_environment_are_only_parsed() -> None:
    assert _runs(["env"]) and _runs(["detect", "--json"])
    assert not _runs(["env", "--clear"])  # would strip this venv's environment fixes
    assert any(argv[1:3] == ["env", "--clear"] for _where, argv in commands())


def _check_python(where: str, args: list[str]) -> None:
    if args[0] == "-m":
        module = args[1]
        if module in ("venv", "pytest", "pip", "http.server"):
            return  # the standard tools; CI runs the venv and pytest lines itself
        assert importlib.util.find_spec(module) is not None, f"{where}: no module {module}"
        help_argv = [sys.executable, "-m", module, "--help"]
    else:
        script = ROOT / args[0]
        if PLACEHOLDER.search(args[0]) or args[0] == "script.py":
            return  # the user's own script
        assert script.is_file(), f"{where}: {args[0]} does not exist"
        help_argv = [sys.executable, str(script), "--help"]
    proc = subprocess.run(
        help_argv, capture_output=True, text=True, cwd=ROOT, timeout=300, check=False
    )
    assert proc.returncode == 0, f"{where}: {shlex.join(help_argv[1:])}: {proc.stderr[-400:]}"


def _check_install(where: str, argv: list[str]) -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "optional-dependencies"
    ]
    for arg in argv:
        match = re.fullmatch(r"\.\[([a-z,]+)\]", arg)
        if match:
            for extra in match.group(1).split(","):
                assert extra in extras, f"{where}: no extra {extra!r} in pyproject.toml"
    if "--exclude-newer" in argv:
        # The test extra sees the index as the lock saw it: one cut-off, the matrix's.
        matrix = tomllib.loads((ROOT / "lock/matrix.toml").read_text(encoding="utf-8"))
        cutoff = argv[argv.index("--exclude-newer") + 1]
        assert cutoff == matrix["lock"]["exclude_newer"], where
    if "-r" in argv:
        name = argv[argv.index("-r") + 1]
        assert name.endswith((".txt", ".toml")), where
        if name.startswith("lock/"):  # a committed file: it must be there
            assert (ROOT / name).is_file(), f"{where}: {name} is not in the repository"
