"""DRM sysfs: /sys/class/drm/cardN/device/{vendor,device,revision,uevent,mem_info_*}.

Each file holds one value ("0x1002", "17163091968"); ``uevent`` holds KEY=VALUE lines
with the bound driver and the PCI slot.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from greta_install.detection.parsers.common import (
    Parsed,
    clean,
    hex_id,
    pci_bus,
    safe_parse,
    to_int,
)

# The files `greta snapshot` copies and `parse_card` reads, relative to cardN/device/.
CARD_FILES: tuple[str, ...] = (
    "vendor",
    "device",
    "revision",
    "subsystem_device",
    "mem_info_vram_total",
    "mem_info_gtt_total",
    "uevent",
)


@dataclass(frozen=True)
class DrmCard:
    card: str
    vendor_id: int | None
    device_id: str | None
    revision: int | None
    pci_bus: str | None
    driver: str | None
    vram_bytes: int | None
    gtt_bytes: int | None


def parse_uevent(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip():
            out[key.strip()] = value.strip()
    return out


def parse_card(card: str, files: Mapping[str, str | None]) -> Parsed[DrmCard]:
    """One card from the text of its device files (missing files are None)."""

    def body(_: str, out: Parsed[DrmCard]) -> None:
        def value(name: str) -> str | None:
            raw = files.get(name)
            if raw is None:
                return None
            text = clean(raw).strip()
            return text or None

        uevent = parse_uevent(value("uevent") or "")
        vendor = to_int(value("vendor"), 16)
        device_raw = value("device")
        device = hex_id(device_raw) if device_raw else None
        pci_id = uevent.get("PCI_ID", "")
        if (vendor is None or device is None) and ":" in pci_id:
            v, _, d = pci_id.partition(":")
            vendor = vendor if vendor is not None else to_int(v, 16)
            device = device or hex_id(d)
        for name in ("vendor", "device", "revision", "mem_info_vram_total", "mem_info_gtt_total"):
            raw = value(name)
            base = 10 if name.startswith("mem_info") else 16
            if raw is not None and to_int(raw, base) is None:
                out.problems.append(f"drm {card}/device/{name}: not a number: {raw[:40]!r}")
        if vendor is None and device is None:
            if any(files.get(n) for n in CARD_FILES):
                out.problems.append(f"drm {card}: no readable vendor/device id")
            return
        out.records.append(
            DrmCard(
                card=card,
                vendor_id=vendor,
                device_id=device,
                revision=to_int(value("revision"), 16),
                pci_bus=pci_bus(uevent.get("PCI_SLOT_NAME")),
                driver=uevent.get("DRIVER") or None,
                vram_bytes=to_int(value("mem_info_vram_total")),
                gtt_bytes=to_int(value("mem_info_gtt_total")),
            )
        )

    joined = "\n".join(v for v in files.values() if v)
    return safe_parse("drm", joined, body)
