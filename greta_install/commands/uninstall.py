"""`greta uninstall`: take GRETA out of an environment, leaving nothing that acts later.

`pip uninstall greta` alone leaves greta-env.pth behind, and that file keeps exporting
GRETA's environment fixes (HSA_OVERRIDE_GFX_VERSION, TRITON_INTERPRET...) at every
start of the interpreter. This removes, in order: the environment fixes (.pth, hook,
JSON), the trust-on-first-use record of this environment, every installed GRETA
kernel wheel, and, unless --keep-greta, the greta distribution itself. The locked
torch / triton / jax stay: they are ordinary packages the user may want to keep.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

from greta_install.commandline import NEUTRAL_CWD, interpreter_path, python_module

HELP = "Remove GRETA from an environment: env fixes (.pth), records, kernel wheels, greta."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--python", type=interpreter_path, help="interpreter of the environment (default: this one)"
    )
    parser.add_argument(
        "--keep-greta",
        action="store_true",
        help="keep the greta distribution (only undo the install)",
    )
    parser.add_argument("--dry-run", action="store_true", help="list what would be removed")


def greta_files(site_packages: Path) -> list[Path]:
    """GRETA's own files in site-packages (not distributions)."""
    from greta_install.environment import envfix
    from greta_install.install import hashrecord

    names = (envfix.PTH_NAME, envfix.HOOK_NAME, envfix.JSON_NAME, hashrecord.RECORD_NAME)
    return [site_packages / n for n in names if (site_packages / n).exists()]


def kernel_distributions(site_packages: Path) -> list[str]:
    out = []
    for info in sorted(site_packages.glob("greta_kernels_*.dist-info")):
        out.append(info.name.split("-", 1)[0].replace("_", "-"))
    return out


def run(args: argparse.Namespace) -> int:
    from greta_install.environment.tools import site_packages_of

    python = args.python or sys.executable
    try:
        site = site_packages_of(python)
    except (ValueError, OSError) as exc:
        print(f"greta uninstall: {exc}", file=sys.stderr)
        return 2
    files = greta_files(site)
    dists = kernel_distributions(site)
    if not args.keep_greta and any(site.glob("greta-*.dist-info")):
        dists.append("greta")
    if args.dry_run:
        for path in files:
            print(f"would remove {path}")
        for dist in dists:
            print(f"would uninstall {dist}")
        return 0
    folders = [p for p in files if p.is_dir() and not p.is_symlink()]
    if folders:
        print(
            f"greta uninstall: {folders[0]} is a folder, not a file GRETA wrote; nothing was "
            f"removed. Look at it, then remove it with: rm -r -- {shlex.quote(str(folders[0]))}",
            file=sys.stderr,
        )
        return 2
    for path in files:
        path.unlink()
        print(f"removed {path}")
    if dists:
        argv = [*python_module(python, "pip"), "uninstall", "-y", *dists]
        proc = subprocess.run(
            argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, cwd=NEUTRAL_CWD
        )
        if proc.returncode != 0:
            print(
                f"greta uninstall: `{' '.join(argv)}` failed: {(proc.stderr or proc.stdout).strip()[-500:]}",
                file=sys.stderr,
            )
            return 1
        print(f"uninstalled {', '.join(dists)}")
    if not files and not dists:
        print(f"nothing of GRETA's in {site}")
    return 0
