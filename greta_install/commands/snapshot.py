"""`greta snapshot DIR`: save what detection reads, to attach to a bug report."""

from __future__ import annotations

import argparse
import sys

HELP = "Save this machine's GPU evidence into DIR (for bug reports); detect --snapshot reads it."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "directory", metavar="DIR", help="where to write (must not exist, or be empty)"
    )


def run(args: argparse.Namespace) -> int:
    from greta_install.commandline import LocationError, location
    from greta_install.detection.detect import detect
    from greta_install.detection.snapshot import write_snapshot
    from greta_install.detection.system_view import LiveSystem, SnapshotSystem

    try:
        # A 120 KB name echoed whole in "cannot write ...": refused first, in one short line.
        location(args.directory, "DIR")
        files = write_snapshot(LiveSystem(), args.directory)
    except LocationError as exc:
        print(f"greta snapshot: {exc}", file=sys.stderr)
        return 2
    except FileExistsError as exc:
        print(f"greta snapshot: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(
            f"greta snapshot: cannot write {args.directory}: {exc.strerror or exc}", file=sys.stderr
        )
        return 1
    detection = detect(SnapshotSystem(args.directory))
    print(f"snapshot written to {args.directory} ({len(files)} files):")
    for name in files:
        print(f"  {name}")
    arch = f" ({detection.arch})" if detection.arch else ""
    print(f"it detects as: {detection.target}{arch}")
    print("serial numbers and UUIDs are replaced by REDACTED; review the files before sharing them")
    return 0
