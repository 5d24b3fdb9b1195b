"""`greta detect`: what GPU this machine (or a snapshot) has and which target it gets."""

from __future__ import annotations

import argparse
import json
import sys

HELP = "Detect the GPUs of this machine (or of a snapshot) and the GRETA target for it."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--snapshot", metavar="DIR", help="read a snapshot directory instead of this machine"
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--all-tools",
        action="store_true",
        help="run every vendor tool even when sysfs already answers (slower)",
    )


def _gib(n: int | None) -> str:
    return f"{n / 2**30:.1f} GiB" if n else "-"


def render(det_json: dict) -> str:
    """The human report: a short table of GPUs, the target, env fixes, warnings."""
    lines = [
        f"target: {det_json['target']}"
        + (f"  (arch {det_json['arch']})" if det_json["arch"] else "")
    ]
    gpus = det_json["gpus"]
    if gpus:
        header = ("", "#", "vendor", "arch", "product", "pci id", "bus", "vram", "notes")
        rows = [header]
        for i, g in enumerate(gpus):
            flags = []
            if g["integrated"]:
                flags.append("integrated")
            if not g["usable"]:
                flags.append("NOT USABLE")
            rows.append(
                (
                    "*" if i == det_json["primary"] else "",
                    str(i),
                    g["vendor"],
                    g["arch"] or "?",
                    g["product"] or "?",
                    g["pci_id"] or "-",
                    g["pci_bus"] or "-",
                    _gib(g["vram_bytes"]),
                    ", ".join(flags),
                )
            )
        widths = [max(len(r[c]) for r in rows) for c in range(len(header))]
        for r in rows:
            lines.append(
                "  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
            )
    versions = [
        f"{k.replace('_', ' ')} {det_json[k]}"
        for k in ("rocm_version", "driver_version", "cuda_version")
        if det_json.get(k)
    ]
    if versions:
        lines.append(", ".join(versions))
    if det_json["env"]:
        lines.append("environment this machine needs:")
        lines.extend(f"  export {k}={v}" for k, v in det_json["env"].items())
    if det_json.get("blockers"):
        lines.append("GPU present but not usable here:")
        lines.extend(f"  - {b}" for b in det_json["blockers"])
    if det_json["warnings"]:
        lines.append("warnings:")
        lines.extend(f"  - {w}" for w in det_json["warnings"])
    used = [k for k, v in det_json["sources"].items() if v == "ok"]
    lines.append(f"sources read: {', '.join(used) or 'none'}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from greta_install.detection.detect import detect
    from greta_install.detection.system_view import open_view

    try:
        view = open_view(args.snapshot)
    except FileNotFoundError as exc:
        print(f"greta detect: {exc}", file=sys.stderr)
        return 2
    detection = detect(view, "all" if args.all_tools else None)
    data = detection.to_json()
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print(render(data))
    return 0
