"""``rocm-smi`` output in every shape users paste.

- per-GPU lines ``GPU[0]  : Device ID: 0x74a1`` (``--showproductname``, ``--showhw`` in
  older releases, ``--showallinfo``, and the ``GPU ID:`` key of ROCm 1.x/2.x);
- ``--json`` (``{"card0": {"Card Model": "0x7408", ...}}``), read line by line so a
  paste cut mid-object still gives what it holds;
- ``--csv`` (``device,Card series,Card model,...`` then ``card0,...`` rows);
- the concise tables: ROCm 6 (``0  1  0x73df,  61797 ...``), ROCm 5 and older
  (``0    37.0c   38.0W ...``: only the index), and ``--showhw`` tables old
  (``0    164e  N/A ... 0000:12:00.0``) and new (``0  1  0x73df  61797  gfx1031 ...``);
- ``Driver version: 6.7.0``.

"Card model" is the device id in ROCm 6 but the *subsystem* id in ROCm 4/5 (0x0c34 on
MI100 and MI210 alike), so it counts as a device id only where GRETA's PCI table knows
it. "GFX Version" is spelled in decimal (gfx9010 for gfx90a): see `gfx_from_decimal`.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field

from greta_install.detection import pci_ids
from greta_install.detection.parsers.common import Parsed, hex_id, pci_bus, safe_parse, to_int

_KV = re.compile(r"^\s*GPU\[(?P<idx>\d+)\]\s*:\s*(?P<key>[^:]+?)\s*:\s*(?P<value>.*?)\s*$")
_ROW = re.compile(r"^\s*(?P<idx>\d+)\s+(?P<node>\d+)\s+(?P<did>0x[0-9a-fA-F]{1,4})\b")
_OLD_HW_ROW = re.compile(r"^\s*(?P<idx>\d+)\s+(?P<did>[0-9a-fA-F]{4})\s")
_HW_HEADER = re.compile(r"^\s*GPU\s+(?:NODE\s+)?DID\b")
# ROCm 5 and older concise rows start with the index and a temperature ("37.0c",
# "42.0°C"); a row of N/A is a non-AMD DRM card rocm-smi walked (an Intel iGPU).
_CONCISE_ROW = re.compile(r"^\s*(?P<idx>\d+)\s+\d+(?:\.\d+)?\s*(?:°\s*)?[cC]\s")
_JSON_TOKEN = re.compile(
    r'"card(?P<card>\d+)"\s*:\s*\{|"(?P<other>[^"\n]+)"\s*:\s*\{'
    r'|"(?P<key>[^"\n]+)"\s*:\s*"(?P<value>[^"\n]*)"'
)
_JSON_LINE = re.compile(r'^\s*"[^"]*"\s*:')
_CSV_ROW = re.compile(r"^\s*card(?P<idx>\d+)\s*,")
_GFX = re.compile(r"\bgfx([0-9a-f]{3,5})\b")
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
    node: int | None = None  # KFD node id
    partition: str | None = None
    guid: str | None = None  # KFD gpu_id, the same number as amd-smi's KFD_ID
    unique_id: str | None = None
    keys: dict[str, str] = field(default_factory=dict)


def gfx_from_decimal(text: str | None) -> str | None:
    """rocm-smi's "GFX Version" → a gfx target: "gfx9010" → "gfx90a", "gfx942" stays.

    rocm-smi prints major, minor and stepping as decimal numbers one after the other,
    so a stepping above 9 comes out as two digits. A name with hex letters is already
    a target name.
    """
    match = _GFX.search((text or "").lower())
    if not match:
        return None
    digits = match.group(1)
    if not digits.isdigit():
        return f"gfx{digits}"
    major_len = 1 if digits[0] in "6789" else 2
    if len(digits) < major_len + 2:
        return None
    major, minor, step = (
        int(digits[:major_len]),
        int(digits[major_len]),
        int(digits[major_len + 1 :]),
    )
    if step > 15:
        return None
    return f"gfx{major}{minor:x}{step:x}"


def _known_id(value: str | None) -> str | None:
    """A hex id that GRETA's PCI table knows (so not a subsystem id)."""
    did = hex_id(value) if value and re.fullmatch(r"\s*(?:0x)?[0-9a-fA-F]{3,4}\s*", value) else None
    return did if did and pci_ids.lookup(did) is not None else None


def _set(record: RocmSmiGpu, key: str, value: str) -> None:
    key = key.strip().lower().rstrip(":")
    value = value.strip()
    record.keys.setdefault(key, value)
    if not value or value.upper() == "N/A":
        return
    if key in ("device id", "gpu id") and record.device_id is None:
        record.device_id = hex_id(value)
    elif key == "card model" and record.device_id is None:
        record.device_id = _known_id(value)
    elif key == "device rev" and record.revision is None:
        record.revision = to_int(value, 16)
    elif key == "pci bus" and record.pci_bus is None:
        record.pci_bus = pci_bus(value)
    elif key in ("gfx version", "target graphics version") and record.gfx is None:
        record.gfx = gfx_from_decimal(value)
    elif key in ("card series", "device name", "marketing name"):
        # ROCm 4 printed the device id as the card series ("0x738c").
        if record.device_id is None and (known := _known_id(value)):
            record.device_id = known
        elif record.product is None and not re.fullmatch(r"0x[0-9a-fA-F]+", value):
            record.product = value
    elif key == "card sku":
        record.sku = value
    elif key == "compute partition":
        record.partition = value
    elif key == "node id":
        record.node = to_int(value)
    elif key == "guid":
        record.guid = value
    elif key == "unique id":
        record.unique_id = value


def parse(text: str | None) -> Parsed[RocmSmiGpu]:
    def body(clean_text: str, out: Parsed[RocmSmiGpu]) -> None:
        gpus: dict[int, RocmSmiGpu] = {}
        json_card: int | None = None
        csv_header: list[str] | None = None
        in_hw_table = False

        def gpu(idx: int) -> RocmSmiGpu:
            if idx not in gpus:
                gpus[idx] = RocmSmiGpu(index=idx)
            return gpus[idx]

        for token in _JSON_TOKEN.finditer(clean_text):
            # --json, pretty-printed or on one line, complete or cut: "cardN": { opens a
            # GPU, "Key": "value" pairs fill it.
            if token["card"] is not None:
                json_card = int(token["card"])
            elif token["other"] is not None:
                json_card = None  # "system": {...} and the like are no GPU
            elif json_card is not None:
                _set(gpu(json_card), token["key"], token["value"])
        for line in clean_text.splitlines():
            driver = _DRIVER.match(line)
            if driver:
                out.info["driver_version"] = driver.group(1)
                continue
            kv = _KV.match(line)
            if kv:
                _set(gpu(int(kv["idx"])), kv["key"], kv["value"])
                continue
            if _JSON_LINE.match(line):
                continue
            if line.strip().startswith("device,"):
                csv_header = next(csv.reader([line.strip()]))
                continue
            row_csv = _CSV_ROW.match(line)
            if row_csv and csv_header:
                cells = next(csv.reader([line.strip()]))
                record = gpu(int(row_csv["idx"]))
                for name, value in zip(csv_header[1:], cells[1:], strict=False):
                    _set(record, name, value)
                continue
            if line.strip().startswith("=") or not line.strip():
                in_hw_table = False if not line.strip() else in_hw_table
                continue
            if _HW_HEADER.match(line):
                in_hw_table = True
                continue
            row = _ROW.match(line)
            if row:
                record = gpu(int(row["idx"]))
                record.device_id = record.device_id or hex_id(row["did"])
                record.node = int(row["node"])
                found = _GFX.search(line)
                if found and record.gfx is None:
                    record.gfx = gfx_from_decimal(found.group(0))
                bus = _BUS.search(line[row.end() :])
                if bus and record.pci_bus is None:
                    record.pci_bus = pci_bus(bus.group(1))
                continue
            old = _OLD_HW_ROW.match(line) if in_hw_table else None
            if old:
                record = gpu(int(old["idx"]))
                record.device_id = record.device_id or hex_id(old["did"])
                bus = _BUS.search(line[old.end() :])
                if bus and record.pci_bus is None:
                    record.pci_bus = pci_bus(bus.group(1))
                continue
            concise = _CONCISE_ROW.match(line)
            if concise:
                gpu(int(concise["idx"]))
        out.records.extend(gpus[i] for i in sorted(gpus))

    return safe_parse("rocm-smi", text, body)
