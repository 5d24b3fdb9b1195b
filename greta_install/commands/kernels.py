"""`greta kernels`: get the GRETA kernel wheel for this GPU into an environment.

The kernel-wheel step of `greta install`, runnable alone (e.g. where torch came from
elsewhere): reuse the cached build for this arch + installed Triton + GRETA source, or
build it with the installed Triton, then install it. `--index DIR` also files the wheel
in a static PEP 503 index with SHA256SUMS that a team serves and points
GRETA_KERNEL_INDEX at.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from greta_install.commandline import interpreter_path

HELP = "Build (or reuse the cached) GRETA kernel wheel for this GPU and install it."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arch", help="GPU arch, e.g. sm_90, gfx942 (default: detected)")
    parser.add_argument(
        "--python", type=interpreter_path, help="interpreter of the environment (default: this one)"
    )
    parser.add_argument(
        "--no-cache", action="store_true", help="rebuild even if a cached wheel fits"
    )
    parser.add_argument("--no-install", action="store_true", help="build/cache only")
    parser.add_argument("--index", type=Path, help="also write the wheel into this static index")
    parser.add_argument(
        "--jobs",
        type=int,
        default=0,
        help="worker processes compiling kernels (default: GRETA_BUILD_JOBS, else all cores)",
    )


def _detected_arch() -> tuple[str | None, str | None]:
    from greta_install.detection.detect import detect
    from greta_install.detection.system_view import open_view

    det = detect(open_view(None))
    return det.arch, det.target


def run(args: argparse.Namespace) -> int:
    from greta_install.install import kernel_build as kb

    python = args.python or sys.executable
    arch, target = args.arch, None
    if arch is None:
        try:
            arch, target = _detected_arch()
        except Exception as exc:  # detection failing is reported, not raised
            print(f"greta kernels: detection failed ({exc}); pass --arch", file=sys.stderr)
            return 2
        if target == "cpu" or arch is None:
            print(
                "greta kernels: no GPU target here, so no kernel wheel: on the cpu row Triton "
                "kernels run in Triton's interpreter and there is nothing to precompile"
            )
            return 0
    try:
        built = kb.build_or_reuse(python, arch, jobs=args.jobs, use_cache=not args.no_cache)
        if args.index:
            kb.write_index([built.path], args.index)
            print(f"index: {args.index} (serve it and set GRETA_KERNEL_INDEX to its URL)")
        if not args.no_install:
            kb.install_wheel(python, built.path, arch=arch)
    except kb.KernelBuildError as exc:
        print(f"greta kernels: {exc}", file=sys.stderr)
        return 1
    how = "reused from the cache" if built.cached else f"built in {built.seconds:.0f}s"
    print(f"kernel wheel {built.path.name} ({how}, sha256:{built.sha256})")
    return 0
