"""`greta env`: print (or clear) the environment fixes `greta install` persisted."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from greta_install.commandline import interpreter_path

HELP = 'Print the environment fixes of an environment as shell exports (eval "$(greta env)").'


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--python", type=interpreter_path, help="interpreter of the environment (default: this one)"
    )
    parser.add_argument(
        "--clear", action="store_true", help="remove the persisted fixes from the environment"
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    from greta_install.environment.tools import python_version_of, scheme_of

    python = args.python or sys.executable
    try:
        scheme = scheme_of(python, python_version_of(python))
    except (ValueError, OSError) as exc:
        print(f"greta env: {exc}", file=sys.stderr)
        return 2
    from greta_install.install import transaction

    site_packages = scheme.purelib

    def say(message: str) -> None:
        print(message, file=sys.stderr)

    # Any greta run on an environment first finishes what a killed install left there.
    lock = transaction.EnvLock(site_packages)
    try:
        lock.acquire(say)
        transaction.recover(site_packages, say, scheme.roots)
        transaction.sweep_stale_stages(Path(tempfile.gettempdir()), say)
    except (transaction.TransactionError, OSError) as exc:
        say(f"greta env: {exc}")
        return 1
    try:
        return _run(args, site_packages)
    finally:
        lock.release()


def _run(args: argparse.Namespace, site_packages: Path) -> int:
    from greta_install.environment import envfix

    if args.clear:
        try:
            removed = envfix.clear_env_fixes(site_packages)
        except envfix.EnvFixError as exc:
            print(f"greta env: {exc}", file=sys.stderr)
            return 2
        if args.json:
            print(json.dumps({"removed": [str(p) for p in removed]}, indent=2))
        elif removed:
            print(f"removed GRETA's environment fixes from {site_packages}")
        else:
            print(f"no GRETA environment fixes in {site_packages}")
        return 0
    try:
        data = envfix.read_env_fixes(site_packages)
    except envfix.EnvFixError as exc:
        print(f"greta env: {exc}", file=sys.stderr)
        return 2
    if data is None:
        if args.json:
            print(json.dumps({"env": {}, "why": {}, "target": None}, indent=2))
        print(
            f"# no GRETA environment fixes are installed in {site_packages} (run `greta install`)",
            file=sys.stderr,
        )
        return 0
    if args.json:
        print(json.dumps({k: data.get(k) for k in ("target", "arch", "env", "why")}, indent=2))
    else:
        sys.stdout.write(envfix.format_exports(data["env"], data.get("why")))
    return 0
