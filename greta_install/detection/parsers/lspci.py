"""``lspci -nn [-D] [-k]`` output.

A device line is ``[domain:]bus:dev.fn Class name [cccc]: Vendor Device [vvvv:dddd] (rev rr)``;
with ``-k`` indented lines follow with the subsystem and the bound kernel driver.
Bridges, audio functions and CPU devices are listed too: ``is_gpu`` tells them apart.

Users setting up GPU passthrough paste the IOMMU-group listing of the common VFIO scripts:
``IOMMU Group N:`` headers over tab-indented ``lspci -nns`` lines, or one
``IOMMU Group N <lspci -nns line>`` per device; both are read as device lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from greta_install.detection.parsers.common import Parsed, hex_id, pci_bus, safe_parse

AMD = 0x1002
NVIDIA = 0x10DE
# VGA, 3D, other display controller, processing accelerator (MI300X is 1200).
GPU_CLASSES: frozenset[str] = frozenset({"0300", "0302", "0380", "1200"})

_DEVICE = re.compile(
    r"^(?P<slot>(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s+"
    r"(?P<cls>[^\[]*?)\s*\[(?P<code>[0-9a-fA-F]{4})\]:\s*(?P<desc>.*?)\s*"
    r"\[(?P<vendor>[0-9a-fA-F]{4}):(?P<device>[0-9a-fA-F]{4})\]"
    r"(?:\s*\(rev (?P<rev>[0-9a-fA-F]{1,2})\))?"
)
# `lspci` without -nn: "03:00.0 VGA compatible controller: Advanced Micro Devices, Inc.
# [AMD/ATI] Navi 31 [Radeon RX 7900 XT/7900 XTX/7900M] (rev c8)".
_NAMED = re.compile(
    r"^(?P<slot>(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s+"
    r"(?P<cls>VGA compatible controller|3D controller|Display controller|Processing accelerators)"
    r":\s*(?P<desc>.*?)(?:\s*\(rev (?P<rev>[0-9a-fA-F]{1,2})\))?\s*$"
)
_CLASS_CODES = {
    "VGA compatible controller": "0300",
    "3D controller": "0302",
    "Display controller": "0380",
    "Processing accelerators": "1200",
}
# The group prefix of the one-line VFIO listing, and its header line in the other form.
_IOMMU_PREFIX = re.compile(r"^IOMMU Group \d{1,5}:?\s*")
_SLOT_ONLY = re.compile(r"^(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]\s")
_VENDOR_PREFIXES = (
    "Advanced Micro Devices, Inc. [AMD/ATI]",
    "Advanced Micro Devices, Inc. [AMD]",
    "NVIDIA Corporation",
)


@dataclass(frozen=True)
class PciDevice:
    slot: str  # normalised: "0000:85:00.0" or "c5:00.0" when lspci ran without -D
    class_code: str  # "0300"
    class_name: str
    vendor_id: int
    device_id: str  # "0x74a1"
    revision: int | None
    name: str  # device description without the vendor name
    subsystem: str | None = None
    driver: str | None = None  # "Kernel driver in use" (only with -k)
    modules: tuple[str, ...] = ()

    @property
    def is_gpu(self) -> bool:
        return self.vendor_id in (AMD, NVIDIA) and self.class_code in GPU_CLASSES


def _strip_vendor(desc: str) -> str:
    for prefix in _VENDOR_PREFIXES:
        if desc.startswith(prefix):
            return desc[len(prefix) :].strip()
    return desc.strip()


def _detail_value(line: str) -> str:
    # Copy-pasted captures carry annotations ("gim # PF device is ..."): keep the value.
    value = line.split(":", 1)[1]
    return value.split("#", 1)[0].strip()


def _from_name(line: str) -> PciDevice | None:
    """An AMD GPU line of `lspci` without -nn, when its name identifies the chip."""
    from greta_install.detection.pci_ids import lookup_by_name

    match = _NAMED.match(line)
    if not match or not match["desc"].startswith("Advanced Micro Devices"):
        return None
    name = _strip_vendor(match["desc"])
    found = lookup_by_name(name)
    slot = pci_bus(match["slot"])
    if found is None or slot is None:
        return None
    device_id, _info = found
    return PciDevice(
        slot=slot,
        class_code=_CLASS_CODES[match["cls"]],
        class_name=match["cls"],
        vendor_id=AMD,
        device_id=device_id,
        revision=int(match["rev"], 16) if match["rev"] else None,
        name=name,
    )


def parse(text: str | None) -> Parsed[PciDevice]:
    def body(clean_text: str, out: Parsed[PciDevice]) -> None:
        unreadable: list[int] = []
        for lineno, line in enumerate(clean_text.splitlines(), 1):
            if not line.strip():
                continue
            line = _IOMMU_PREFIX.sub("", line)
            if not line.strip():
                continue
            if line[0] in " \t" and _DEVICE.match(line.strip()):
                # an IOMMU group's member: a device line, not a detail of the last one
                line = line.strip()
            if line[0] in " \t":
                if not out.records or ":" not in line:
                    continue
                key = line.split(":", 1)[0].strip().lower()
                last = out.records[-1]
                if key == "kernel driver in use":
                    out.records[-1] = replace(last, driver=_detail_value(line) or None)
                elif key == "kernel modules":
                    mods = tuple(m.strip() for m in _detail_value(line).split(",") if m.strip())
                    out.records[-1] = replace(last, modules=mods)
                elif key == "subsystem":
                    out.records[-1] = replace(last, subsystem=_detail_value(line) or None)
                continue
            match = _DEVICE.match(line.strip())
            if not match:
                named = _from_name(line.strip())
                if named is not None:
                    out.records.append(named)
                elif _SLOT_ONLY.match(line.strip()) and _NAMED.match(line.strip()):
                    unreadable.append(lineno)
                continue
            slot = pci_bus(match["slot"])
            device = hex_id(match["device"])
            if slot is None or device is None:
                unreadable.append(lineno)
                continue
            out.records.append(
                PciDevice(
                    slot=slot,
                    class_code=match["code"].lower(),
                    class_name=match["cls"].strip(),
                    vendor_id=int(match["vendor"], 16),
                    device_id=device,
                    revision=int(match["rev"], 16) if match["rev"] else None,
                    name=_strip_vendor(match["desc"]),
                )
            )
        if unreadable:
            shown = ", ".join(str(n) for n in unreadable[:5])
            out.problems.append(
                f"lspci: {len(unreadable)} GPU line(s) without [vendor:device] ids whose name does "
                f"not identify the chip (line {shown}); run lspci -nn for them"
            )

    return safe_parse("lspci", text, body)
