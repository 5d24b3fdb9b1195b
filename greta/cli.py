"""`greta` command line: a thin dispatcher.

Every subcommand lives in its own module exposing ``HELP`` (one line),
``add_arguments(parser)`` and ``run(args) -> int``. Command modules import nothing
heavy at module level: ``greta detect`` and ``greta install`` run before torch and
jax exist, and ``greta --help`` must stay fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from greta import __version__
from greta_install.errors import GretaError

# name -> module; order is the order shown in --help.
COMMANDS: dict[str, str] = {
    "detect": "greta_install.commands.detect",
    "snapshot": "greta_install.commands.snapshot",
    "install": "greta_install.commands.install",
    "uninstall": "greta_install.commands.uninstall",
    "smoke": "greta_install.commands.smoke",
    "kernels": "greta_install.commands.kernels",
    "env": "greta_install.commands.env",
    "doctor": "greta_install.commands.doctor",
    "lock": "greta_install.commands.lock",
    "backends": "greta_core.commands.backends",
    "bench": "greta_core.commands.bench",
    "build-kernels": "greta_core.commands.build_kernels",
    "tune": "greta_core.commands.tune",
    "warm": "greta_core.commands.warm",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser with every command, or with `only` (the command being run: importing
    the other commands' modules cost a third of a short command's start)."""
    parser = argparse.ArgumentParser(
        prog="greta",
        description="Run the same AI code on AMD Radeon, AMD Instinct, NVIDIA and CPU.",
    )
    parser.add_argument("--version", action="version", version=f"greta {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        if only is not None and name != only:
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            # A command whose module is absent from this build is listed, not fatal.
            if exc.name and module_name.startswith(exc.name):
                continue
            raise
        cmd = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(cmd)
        cmd.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # The command comes first (the only top-level options are --help and --version); a
    # name that is no command builds every parser, so argparse lists the choices.
    parser = build_parser(argv[0] if argv and argv[0] in COMMANDS else None)
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        print("greta: interrupted", file=sys.stderr)
        return 130
    except GretaError as exc:  # bad input a command did not word itself: one line, no traceback
        print(f"greta {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
