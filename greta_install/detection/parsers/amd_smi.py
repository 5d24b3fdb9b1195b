"""``amd-smi`` output in every shape users paste.

- ``amd-smi static`` and ``amd-smi list``: ``GPU: N`` blocks of indented ``KEY: value``
  lines (``CPU: N`` blocks on MI300A and EPYC hosts are skipped). The two are often
  pasted together: blocks with the same index are one GPU, merged, never two;
- ``--json`` of either (``"gpu": 0`` starts a block; nested sections become
  ``SECTION.KEY``), read line by line so a cut paste still gives what it holds;
- ``--csv`` (a ``gpu,...`` header row);
- the plain table ROCm 7 prints with no arguments (``| 0000:09:00.0  AMD Instinct MI325X |``).

Keys are looked up by name wherever they sit in a block, so sections that move between
releases still parse. The whole paste may be indented (notebook and blog output).
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass

from greta_install.detection import pci_ids
from greta_install.detection.parsers.common import Parsed, hex_id, pci_bus, safe_parse, to_int

_BLOCK = re.compile(r"^(?P<kind>GPU|CPU|NPU)\s*:\s*(?P<idx>\d+)\s*$")
_KV = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Z0-9_ ]+?)\s*:\s*(?P<value>.*?)\s*$")
_JSON_KV = re.compile(r'^(?P<indent>\s*)"(?P<key>[^"]+)"\s*:\s*(?P<value>.*?)\s*,?\s*$')
_GFX = re.compile(r"\b(gfx[0-9a-f]{3,4})\b")
_MB = re.compile(r"^(\d+)\s*MB$", re.I)
_UUID = re.compile(r"^[0-9a-fA-F]{4}([0-9a-fA-F]{4})-[0-9a-fA-F]{4}-")
_TABLE_GPU = re.compile(
    r"^\|\s*(?P<bus>(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s+"
    r"(?P<name>[^|]*?)\s*\|(?P<rest>.*)$"
)
_TABLE_IDS = re.compile(r"^\|\s*(?P<idx>\d+)\s+(?:\d+|N/A)\s+(?:\d+|N/A)\s+(?P<mode>[\w/]+)\s*\|")
_TABLE_MEM = re.compile(r"(\d+)\s*/\s*(\d+)\s*MB")


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
    uuid: str | None = None
    kfd_id: str | None = None  # the KFD gpu_id, rocm-smi's GUID
    node_id: int | None = None  # the KFD node
    compute_units: int | None = None


def _na(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip().strip('"').strip()
    return None if not value or value.upper() in ("N/A", "NULL", "NONE") else value


def _device_from_uuid(uuid: str | None) -> str | None:
    """amd-smi's UUID carries the device id ("67ff740f-..." → 0x740f); trust it only
    where GRETA's PCI table knows the id, so a UUID of another shape invents nothing."""
    match = _UUID.match(uuid or "")
    if not match:
        return None
    did = hex_id(match.group(1))
    return did if did and pci_ids.lookup(did) is not None else None


def _gpu(index: int, fields: dict[str, str]) -> AmdSmiGpu:
    gfx_match = _GFX.search(fields.get("TARGET_GRAPHICS_VERSION", "").lower())
    vram = _MB.match(fields.get("VRAM.SIZE", "") or fields.get("VRAM_SIZE", ""))
    uuid = _na(fields.get("UUID"))
    return AmdSmiGpu(
        index=index,
        market_name=_na(fields.get("ASIC.MARKET_NAME") or fields.get("MARKET_NAME")),
        device_id=hex_id(_na(fields.get("DEVICE_ID"))) or _device_from_uuid(uuid),
        revision=to_int(_na(fields.get("REV_ID")), 16),
        pci_bus=pci_bus(fields.get("BDF")),
        gfx=gfx_match.group(1) if gfx_match else None,
        driver_name=_na(fields.get("DRIVER.NAME")),
        driver_version=_na(fields.get("DRIVER.VERSION")),
        compute_partition=_na(fields.get("COMPUTE_PARTITION")),
        vram_bytes=int(vram.group(1)) * 1024 * 1024 if vram else None,
        product_name=_na(fields.get("BOARD.PRODUCT_NAME")),
        uuid=uuid,
        kfd_id=_na(fields.get("KFD_ID")),
        node_id=to_int(_na(fields.get("NODE_ID"))),
        compute_units=to_int(_na(fields.get("NUM_COMPUTE_UNITS"))),
    )


def _blocks(text: str, blocks: dict[int, dict[str, str]]) -> None:
    """The ``GPU: N`` block form (plain or indented), merging blocks of one index."""
    index: int | None = None
    base_indent: int | None = None
    sections: list[tuple[int, str]] = []
    for line in text.splitlines():
        indent = len(line) - len(line.lstrip())
        block = _BLOCK.match(line.strip())
        if block and (base_indent is None or indent <= base_indent):
            base_indent = indent
            index = int(block["idx"]) if block["kind"] == "GPU" else None
            sections = []
            continue
        if index is None:
            continue
        kv = _KV.match(line)
        if not kv:
            continue
        key, value = kv["key"].strip(), kv["value"]
        while sections and sections[-1][0] >= indent:
            sections.pop()
        if not value:
            sections.append((indent, key))
            continue
        fields = blocks.setdefault(index, {})
        # Keep both the bare key (first one wins) and "SECTION.KEY": NAME and
        # VERSION exist in several sections (VBIOS, DRIVER, BOARD).
        fields.setdefault(key, value)
        if sections:
            fields.setdefault(f"{sections[-1][1]}.{key}", value)


def _json(text: str, blocks: dict[int, dict[str, str]]) -> None:
    """``--json``: "gpu": N starts a block; an object-valued key opens a section."""
    index: int | None = None
    sections: list[tuple[int, str]] = []
    for line in text.splitlines():
        kv = _JSON_KV.match(line)
        if not kv:
            continue
        key, value, indent = kv["key"].strip().upper(), kv["value"].strip(), len(kv["indent"])
        if key == "GPU" and to_int(value.rstrip(",")) is not None:
            index, sections = to_int(value.rstrip(",")), []
            continue
        if index is None:
            continue
        while sections and sections[-1][0] >= indent:
            sections.pop()
        if value.startswith("{"):
            sections.append((indent, key))
            continue
        value = value.rstrip(",").strip().strip('"')
        if value.startswith("["):
            continue
        fields = blocks.setdefault(index, {})
        fields.setdefault(key, value)
        if sections:
            fields.setdefault(f"{sections[-1][1]}.{key}", value)


def _csv(text: str, blocks: dict[int, dict[str, str]]) -> None:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    header: list[str] | None = None
    for line in lines:
        cells = next(csv.reader([line.strip()]))
        if cells and cells[0].strip().lower() == "gpu":
            header = [c.strip().upper() for c in cells]
            continue
        if header and cells and cells[0].strip().isdigit():
            fields = blocks.setdefault(int(cells[0]), {})
            for name, value in zip(header[1:], cells[1:], strict=False):
                fields.setdefault(name, value)


def _table(text: str, out: Parsed[AmdSmiGpu]) -> None:
    """The plain ROCm 7 table: the BDF/name row, then the GPU index/partition row."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        row = _TABLE_GPU.match(line.strip())
        if not row:
            continue
        ids = _TABLE_IDS.match(lines[i + 1].strip()) if i + 1 < len(lines) else None
        memory = _TABLE_MEM.search(lines[i + 1]) if ids else None
        name = _na(row["name"])
        out.records.append(
            AmdSmiGpu(
                index=int(ids["idx"]) if ids else len(out.records),
                market_name=name,
                device_id=None,
                revision=None,
                pci_bus=pci_bus(row["bus"]),
                gfx=None,
                driver_name=None,
                driver_version=None,
                compute_partition=ids["mode"].split("/")[0] if ids else None,
                vram_bytes=int(memory.group(2)) * 1024 * 1024 if memory else None,
                product_name=None,
            )
        )


def parse(text: str | None) -> Parsed[AmdSmiGpu]:
    def body(clean_text: str, out: Parsed[AmdSmiGpu]) -> None:
        # Each reader acts only on its own form (quoted JSON keys, a "gpu," CSV header,
        # GPU: N blocks), so a paste mixing them, or with tool warnings before the
        # JSON, gives every GPU once: the readers share one record per index.
        blocks: dict[int, dict[str, str]] = {}
        _json(clean_text, blocks)
        _csv(clean_text, blocks)
        _blocks(clean_text, blocks)
        if blocks:
            out.records.extend(_gpu(i, blocks[i]) for i in sorted(blocks))
        else:
            _table(clean_text, out)

    return safe_parse("amd-smi", text, body)
