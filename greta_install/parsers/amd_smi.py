"""``amd-smi static`` plain output: ``GPU: N`` blocks of indented ``KEY: value`` lines.

``CPU: N`` blocks (on MI300A and EPYC hosts) are skipped. Keys are looked up by name
wherever they sit in the block, so sections that move between releases still parse.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from greta_install.parsers.common import Parsed, hex_id, pci_bus, safe_parse, to_int

_BLOCK = re.compile(r"^(?P<kind>GPU|CPU|NPU)\s*:\s*(?P<idx>\d+)\s*$")
_KV = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Z0-9_ ]+?)\s*:\s*(?P<value>.*?)\s*$")
_GFX = re.compile(r"\b(gfx[0-9a-f]{3,4})\b")
_MB = re.compile(r"^(\d+)\s*MB$", re.I)


@dataclass(frozen=True)
class AmdSmiGpu:
    index: int
    market_name: str | None
    device_id: str | None
    revision: int | None
    pci_bus: str | None
    gfx: str | None
    driver_name: str | None
    driver_version: str | None
    compute_partition: str | None
    vram_bytes: int | None
    product_name: str | None


def _na(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip()
    return None if not value or value.upper() == "N/A" else value


def _gpu(index: int, fields: dict[str, str]) -> AmdSmiGpu:
    gfx_match = _GFX.search(fields.get("TARGET_GRAPHICS_VERSION", ""))
    vram = _MB.match(fields.get("VRAM.SIZE", ""))
    return AmdSmiGpu(
        index=index,
        market_name=_na(fields.get("ASIC.MARKET_NAME") or fields.get("MARKET_NAME")),
        device_id=hex_id(_na(fields.get("DEVICE_ID"))),
        revision=to_int(_na(fields.get("REV_ID")), 16),
        pci_bus=pci_bus(fields.get("BDF")),
        gfx=gfx_match.group(1) if gfx_match else None,
        driver_name=_na(fields.get("DRIVER.NAME")),
        driver_version=_na(fields.get("DRIVER.VERSION")),
        compute_partition=_na(fields.get("COMPUTE_PARTITION")),
        vram_bytes=int(vram.group(1)) * 1024 * 1024 if vram else None,
        product_name=_na(fields.get("BOARD.PRODUCT_NAME")),
    )


def parse(text: str | None) -> Parsed[AmdSmiGpu]:
    def body(clean_text: str, out: Parsed[AmdSmiGpu]) -> None:
        index: int | None = None
        fields: dict[str, str] = {}
        section = ""

        def flush() -> None:
            if index is not None and fields:
                out.records.append(_gpu(index, fields))

        for line in clean_text.splitlines():
            block = _BLOCK.match(line.strip()) if not line[:1].isspace() else None
            if block:
                flush()
                fields, section = {}, ""
                index = int(block["idx"]) if block["kind"] == "GPU" else None
                continue
            if index is None:
                continue
            kv = _KV.match(line)
            if not kv:
                continue
            key, value = kv["key"].strip(), kv["value"]
            if not value:
                section = key
                continue
            # Keep both the bare key (first one wins) and "SECTION.KEY": NAME and
            # VERSION exist in several sections (VBIOS, DRIVER, BOARD).
            fields.setdefault(key, value)
            fields.setdefault(f"{section}.{key}", value)
        flush()

    return safe_parse("amd-smi", text, body)
