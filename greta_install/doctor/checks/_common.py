"""Helpers shared by the check modules: reading facts, building fix lines."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from greta_install.doctor.facts import Facts, ProbeResult
from greta_install.doctor.model import Finding, fail, skip
from greta_install.locks.lockfile import LockedPackage
from greta_install.model import Gpu

AMD_TARGETS = frozenset({"mi300x", "radeon", "instinct"})
GPU_TARGETS = AMD_TARGETS | {"cuda"}
SNAPSHOT_SKIP = "snapshot: no live Python environment"

# PCI classes that are GPUs or compute accelerators (bridges and audio functions are not).
_GPU_CLASSES = {"0300", "0302", "0380", "1200"}
_LSPCI_HEAD = re.compile(
    r"^(?P<bus>\S+)\s+(?P<cls_name>[^\[]*)\[(?P<cls>[0-9a-fA-F]{4})\]:.*\[(?P<vendor>[0-9a-fA-F]{4}):(?P<device>[0-9a-fA-F]{4})\]"
)


@dataclass(frozen=True)
class PciDevice:
    bus: str
    pci_class: str
    vendor: str  # "1002"
    device: str  # "74a1"
    line: str
    driver: str | None = None


def lspci_gpus(text: str | None) -> list[PciDevice]:
    """GPU-class functions in `lspci -nn [-k]` text; tolerant of partial or annotated output."""
    devices: list[PciDevice] = []
    if not text:
        return devices
    current: dict[str, Any] | None = None
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line:
            continue
        if not line[0].isspace():
            if current:
                devices.append(PciDevice(**current))
            current = None
            match = _LSPCI_HEAD.match(line)
            if match and match.group("cls") in _GPU_CLASSES:
                current = {
                    "bus": match.group("bus"),
                    "pci_class": match.group("cls"),
                    "vendor": match.group("vendor").lower(),
                    "device": match.group("device").lower(),
                    "line": line.strip(),
                    "driver": None,
                }
        elif current is not None and "Kernel driver in use:" in line:
            # Keep the first word only: posted outputs carry "# ..." annotations.
            value = line.split("Kernel driver in use:", 1)[1].split("#", 1)[0].strip()
            current["driver"] = value.split()[0] if value else None
    if current:
        devices.append(PciDevice(**current))
    return devices


def detection_gpus(facts: Facts, vendor: str | None = None) -> list[Gpu]:
    det = facts.detection
    gpus = list(det.gpus) if det is not None else []
    if vendor:
        gpus = [g for g in gpus if g.vendor == vendor]
    return gpus


def primary_gpu(facts: Facts) -> Gpu | None:
    det = facts.detection
    return det.primary_gpu if det is not None else None


def amd_gpu_expected(facts: Facts) -> bool:
    """Some evidence says an AMD GPU is on this machine (even if unusable from here)."""
    if detection_gpus(facts, "amd") or facts.kfd_sysfs:
        return True
    return any(d.vendor == "1002" for d in lspci_gpus(facts.lspci))


def nvidia_gpu_expected(facts: Facts) -> bool:
    if detection_gpus(facts, "nvidia"):
        return True
    return any(d.vendor == "10de" for d in lspci_gpus(facts.lspci))


def install_fix(facts: Facts) -> str:
    return f"greta install --target {facts.target}" if facts.target else "greta install"


def lock_packages(facts: Facts) -> list[LockedPackage]:
    return list(facts.lock.packages) if facts.lock is not None else []


def lock_pin(facts: Facts, name: str) -> LockedPackage | None:
    for pkg in lock_packages(facts):
        if pkg.name == name:
            return pkg
    return None


def pip_install_line(
    pins: Iterable[tuple[str, str]], indexes: Iterable[str | None] = (), *, force: bool = False
) -> str:
    """`pip install "a==1" ... [--extra-index-url URL]` for (name, version) pins."""
    parts = ["pip", "install"]
    if force:
        parts.append("--force-reinstall")
    parts += [shlex.quote(f"{name}=={version}") for name, version in pins]
    for url in dict.fromkeys(u for u in indexes if u):
        parts += ["--extra-index-url", url]
    return " ".join(parts)


def probe_section(probe: ProbeResult | None, section: str) -> dict[str, Any] | None:
    """The section of a completed probe, or None."""
    if probe is None or probe.outcome != "ok":
        return None
    value = probe.data.get(section)
    return value if isinstance(value, dict) else None


def section_of(probe: ProbeResult | None, name: str) -> dict[str, Any]:
    """A probe section as a dict ({} when absent or of the wrong shape)."""
    if probe is None or probe.outcome != "ok" or not isinstance(probe.data, dict):
        return {}
    value = probe.data.get(name)
    return value if isinstance(value, dict) else {}


def dict_list(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def str_list(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def needs_live(facts: Facts) -> Finding | None:
    return None if facts.live else skip(SNAPSHOT_SKIP)


def probe_missing(facts: Facts, probe: ProbeResult | None, section: str) -> Finding | None:
    """A skip/fail when the probe gave no usable `section`; None when it did."""
    if not facts.live:
        return skip(SNAPSHOT_SKIP)
    if probe is None or probe.outcome == "not_run":
        return skip(f"the {section} probe was not run")
    if probe.outcome != "ok":
        return skip(f"the {section} probe did not complete (see {section}.import)")
    data = probe.data.get(section)
    if not isinstance(data, dict):
        return skip(f"the {section} probe returned no {section} section")
    if data.get("missing"):
        return skip(f"{section} is not installed")
    if data.get("error"):
        return skip(f"{section} does not import (see {section}.import)")
    return None


def probe_failure(probe: ProbeResult, what: str, fix: str) -> Finding:
    tail = probe.stderr_tail.strip().splitlines()[-3:]
    finding = f"the {what} probe {probe.error or probe.outcome}"
    if tail:
        finding += f"; last output: {' | '.join(t.strip() for t in tail)}"
    return fail(
        finding,
        fix,
        outcome=probe.outcome,
        returncode=probe.returncode,
        seconds=probe.seconds,
        stderr_tail=probe.stderr_tail,
    )


def first_line(text: Any, limit: int = 300) -> str:
    lines = str(text or "").strip().splitlines()
    return lines[0][:limit] if lines else ""
