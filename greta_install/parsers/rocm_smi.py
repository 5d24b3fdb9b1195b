"""``rocm-smi`` output in its common shapes.

- per-GPU lines ``GPU[0]  : Device ID: 0x74a1`` (``--showproductname``, ``--showhw``
  in older releases, the full default log);
- the table rows of the concise view and of ``--showhw``
  (``0  1  0x73df,  61797 ...`` / ``0  1  0x73df  61797  gfx1031 ... 0000:03:00.0``);
- ``Driver version: 6.7.0``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from greta_install.parsers.common import Parsed, hex_id, pci_bus, safe_parse, to_int

_KV = re.compile(r"^\s*GPU\[(?P<idx>\d+)\]\s*:\s*(?P<key>[^:]+?)\s*:\s*(?P<value>.*?)\s*$")
_ROW = re.compile(r"^\s*(?P<idx>\d+)\s+(?P<node>\d+)\s+(?P<did>0x[0-9a-fA-F]{1,4})\b")
_GFX = re.compile(r"\b(gfx[0-9a-f]{3,4})\b")
_BUS = re.compile(r"\b((?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\b")
_DRIVER = re.compile(r"^\s*Driver version\s*:\s*(\S+)", re.I)


@dataclass
class RocmSmiGpu:
    index: int
    device_id: str | None = None
    revision: int | None = None
    pci_bus: str | None = None
    gfx: str | None = None
    product: str | None = None  # "Card series", e.g. "AMD Instinct MI300X OAM"
    sku: str | None = None
    node: int | None = None
    partition: str | None = None
    keys: dict[str, str] = field(default_factory=dict)


def parse(text: str | None) -> Parsed[RocmSmiGpu]:
    def body(clean_text: str, out: Parsed[RocmSmiGpu]) -> None:
        gpus: dict[int, RocmSmiGpu] = {}

        def gpu(idx: int) -> RocmSmiGpu:
            if idx not in gpus:
                gpus[idx] = RocmSmiGpu(index=idx)
            return gpus[idx]

        for line in clean_text.splitlines():
            driver = _DRIVER.match(line)
            if driver:
                out.info["driver_version"] = driver.group(1)
                continue
            kv = _KV.match(line)
            if kv:
                record = gpu(int(kv["idx"]))
                key, value = kv["key"].strip().lower(), kv["value"].strip()
                record.keys.setdefault(key, value)
                if key in ("device id", "card model") and record.device_id is None:
                    record.device_id = hex_id(value)
                elif key == "device rev" and record.revision is None:
                    record.revision = to_int(value, 16)
                elif key == "pci bus" and record.pci_bus is None:
                    record.pci_bus = pci_bus(value)
                elif key in ("gfx version", "target graphics version") and record.gfx is None:
                    found = _GFX.search(value)
                    record.gfx = found.group(1) if found else None
                elif key in ("card series", "device name", "marketing name"):
                    if record.product is None and value and value.upper() != "N/A":
                        record.product = value
                elif key == "card sku":
                    record.sku = value or None
                elif key == "compute partition":
                    record.partition = value or None
                continue
            row = _ROW.match(line)
            if row:
                record = gpu(int(row["idx"]))
                record.device_id = record.device_id or hex_id(row["did"])
                record.node = int(row["node"])
                found = _GFX.search(line)
                if found and record.gfx is None:
                    record.gfx = found.group(1)
                bus = _BUS.search(line[row.end() :])
                if bus and record.pci_bus is None:
                    record.pci_bus = pci_bus(bus.group(1))
        out.records.extend(gpus[i] for i in sorted(gpus))

    return safe_parse("rocm-smi", text, body)
