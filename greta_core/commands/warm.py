"""`greta warm`: build the installed kernel wheel's host launchers for this Python.

`greta install` runs it after installing a kernel wheel; run it by hand after installing
one with pip, or after clearing GRETA's cache. See `greta_core.kernel_wheels.host_launchers`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

HELP = "Build the installed kernel wheel's Triton host launchers, so first calls run no C compiler."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable report")
    parser.add_argument(
        "--jobs", type=int, default=0, help="parallel C compiles (default: cores, max 8)"
    )


def warm_installed(jobs: int = 0) -> list[dict[str, Any]]:
    """Warm every installed kernel wheel built for the installed Triton; one row per wheel."""
    import triton

    from greta_core.kernel_wheels import host_launchers
    from greta_core.kernel_wheels.precompiled import installed_wheel_dirs, read_manifest
    from greta_install.install import kernel_build

    rows: list[dict[str, Any]] = []
    for arch, package_dir in installed_wheel_dirs():
        row: dict[str, Any] = {"arch": arch, "package": package_dir.name}
        # The wheel may have come from `pip install` by hand, past every check: the same
        # verification and trust on first use as any kernel wheel GRETA installs, before
        # anything of it is read or compiled.
        try:
            kernel_build.trust_installed(
                package_dir.parent, arch, vouch=False, log=lambda m: print(m, file=sys.stderr)
            )
        except kernel_build.KernelWheelRefused as exc:
            rows.append(row | {"ok": False, "error": f"not warmed: the installed wheel is {exc}"})
            continue
        manifest = read_manifest(package_dir)
        if manifest is None:
            rows.append(row | {"ok": False, "error": "no readable manifest.json (corrupt wheel?)"})
            continue
        if manifest.get("triton_version") != triton.__version__:
            rows.append(
                row
                | {
                    "ok": True,
                    "skipped": f"wheel built for triton {manifest.get('triton_version')}, "
                    f"installed triton is {triton.__version__}: its code is not used",
                }
            )
            continue
        try:
            specs = host_launchers.wheel_specs(package_dir)
        except (OSError, ValueError) as exc:
            rows.append(row | {"ok": False, "error": str(exc)})
            continue
        report = host_launchers.warm(specs.values(), package_dir / "precompiled", jobs=jobs)
        if report.ok:
            host_launchers.write_stamp(manifest, report)
        rows.append(row | report.to_json())
    return rows


def _line(row: dict[str, Any]) -> str:
    head = f"{row['package']}: "
    if "error" in row:
        return head + "FAILED: " + row["error"]
    if "skipped" in row:
        return head + "skipped: " + row["skipped"]
    text = (
        f"{row['ready']}/{row['launchers']} launchers ready ({row['modules']} modules, "
        f"{row['built']} built now), "
        f"driver helpers {row['utils'] or 'not needed'}, "
        f"triton key {row['triton_key']}, {row['seconds']:.1f}s -> {row['directory']}"
    )
    for failure in row["failed"][:5]:
        text += f"\n  failed: {failure}"
    return head + text


def run(args: argparse.Namespace) -> int:
    # Compiling host code needs the real backend, never the interpreter (cpu rows set it).
    os.environ["TRITON_INTERPRET"] = "0"
    try:
        rows = warm_installed(args.jobs)
    except ImportError as exc:
        print(
            f"greta warm: {exc.name or exc} is not installed: run `greta install` first",
            file=sys.stderr,
        )
        return 2
    if args.json:
        print(json.dumps(rows, indent=2))
    elif not rows:
        print("greta warm: no GRETA kernel wheel installed: nothing to build")
    else:
        for row in rows:
            print(_line(row))
    return 0 if all(row.get("ok") for row in rows) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="greta warm", description=HELP)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
