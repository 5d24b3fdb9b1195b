"""``nvidia-smi`` output in three shapes, told apart by their look:

- the CSV query GRETA runs (``index,name,pci.bus_id,pci.device_id,compute_cap,
  driver_version,memory.total``, no header);
- the plain table users paste (``| 0  NVIDIA H100 80GB HBM3  On | 00000000:18:00.0 Off |``);
- ``nvidia-smi -q`` (``Product Name : ...`` blocks).

Only the CSV carries the compute capability; the other two give the name, which
``archs.sm_from_name`` maps.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from greta_install.detection.parsers.common import Parsed, pci_bus, safe_parse, to_int

_TABLE_ROW = re.compile(
    r"^\|\s*(?P<idx>\d+)\s+(?P<name>.+?)\s+(?:On|Off|N/A)?\s*\|\s*"
    r"(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])"
)
# Integrated GPUs (Jetson Orin/Thor) print "N/A" where the bus id goes.
_TABLE_ROW_NO_BUS = re.compile(
    r"^\|\s*(?P<idx>\d+)\s+(?P<name>.+?)\s+(?:On|Off|N/A)\s*\|\s*N/A\s+(?:On|Off|N/A)?\s*\|"
)
_TABLE_MEM = re.compile(r"(\d+)\s*MiB\s*/\s*(\d+)\s*MiB")
_VERSIONS = re.compile(
    r"Driver Version:\s*(?P<driver>[\d.]+)(?:.*?CUDA Version:\s*(?P<cuda>[\d.]+))?"
)
_Q_KV = re.compile(r"^(?P<indent>\s*)(?P<key>[^:]+?)\s*:\s*(?P<value>.*?)\s*$")
_Q_GPU = re.compile(r"^GPU\s+(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")
_FAILURE = re.compile(
    r"(NVIDIA-SMI has failed.*|No devices were found.*|Failed to initialize NVML.*)"
)
_CAP = re.compile(r"^\d+\.\d+$")


@dataclass(frozen=True)
class NvidiaGpu:
    index: int
    name: str | None
    pci_bus: str | None
    device_id: str | None  # "0x2330"
    compute_cap: str | None  # "9.0"
    architecture: str | None  # "Hopper" (-q only)
    memory_mib: int | None
    integrated: bool = False  # no PCI bus id: an SoC GPU (Jetson)


def _device_id(value: str | None) -> str | None:
    # nvidia-smi prints the combined id 0xDDDDVVVV (device, then vendor 10DE); a cut
    # paste leaves a prefix of it, which must not pass for another id.
    match = re.fullmatch(r"\s*(?:0x)?([0-9a-fA-F]{4})(10de)?\s*", value or "", re.I)
    if not match or int(match.group(1), 16) == 0:
        return None
    return f"0x{int(match.group(1), 16):04x}"


def _mib(value: str | None) -> int | None:
    if not value:
        return None
    match = re.match(r"\s*(\d+)", value)
    return int(match.group(1)) if match else None


def _parse_csv(text: str, out: Parsed[NvidiaGpu]) -> None:
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 3 or to_int(cells[0]) is None:
            out.problems.append(f"nvidia-smi csv line {lineno}: unexpected {line[:60]!r}")
            continue
        cells += [""] * (7 - len(cells))
        cap = cells[4] if _CAP.match(cells[4]) else None
        out.records.append(
            NvidiaGpu(
                index=int(cells[0]),
                name=cells[1] or None,
                pci_bus=pci_bus(cells[2]),
                device_id=_device_id(cells[3]),
                compute_cap=cap,
                architecture=None,
                memory_mib=_mib(cells[6]),
            )
        )
        if cells[5] and re.match(r"^[\d.]+$", cells[5]):
            out.info.setdefault("driver_version", cells[5])


def _parse_table(text: str, out: Parsed[NvidiaGpu]) -> None:
    lines = text.splitlines()
    for i, line in enumerate(lines):
        versions = _VERSIONS.search(line)
        if versions:
            out.info.setdefault("driver_version", versions["driver"])
            if versions["cuda"]:
                out.info.setdefault("cuda_version", versions["cuda"])
            continue
        row = _TABLE_ROW.match(line)
        if not row:
            soc = _TABLE_ROW_NO_BUS.match(line)
            if soc:
                out.records.append(
                    NvidiaGpu(
                        index=int(soc["idx"]),
                        name=soc["name"].strip() or None,
                        pci_bus=None,
                        device_id=None,
                        compute_cap=None,
                        architecture=None,
                        memory_mib=None,
                        integrated=True,
                    )
                )
            continue
        memory = _TABLE_MEM.search(lines[i + 1]) if i + 1 < len(lines) else None
        name = row["name"].strip()
        out.records.append(
            NvidiaGpu(
                index=int(row["idx"]),
                name=name or None,
                pci_bus=pci_bus(row["bus"]),
                device_id=None,
                compute_cap=None,
                architecture=None,
                memory_mib=int(memory.group(2)) if memory else None,
            )
        )


def _parse_query(text: str, out: Parsed[NvidiaGpu]) -> None:
    current: dict[str, str] | None = None
    bus: str | None = None
    section = ""

    def flush() -> None:
        if current is None:
            return
        out.records.append(
            NvidiaGpu(
                index=len(out.records),
                name=current.get("Product Name"),
                pci_bus=pci_bus(current.get("PCI.Bus Id") or bus),
                device_id=_device_id(current.get("PCI.Device Id")),
                compute_cap=None,
                architecture=current.get("Product Architecture"),
                memory_mib=_mib(current.get("FB Memory Usage.Total")),
            )
        )

    for line in text.splitlines():
        gpu = _Q_GPU.match(line)
        if gpu:
            flush()
            current, bus, section = {}, gpu["bus"], ""
            continue
        kv = _Q_KV.match(line)
        if kv is None:
            if line.strip() and current is not None and len(line) - len(line.lstrip()) == 4:
                section = line.strip()
            continue
        key, value, indent = kv["key"].strip(), kv["value"], len(kv["indent"])
        if current is None:
            if key == "Driver Version":
                out.info.setdefault("driver_version", value)
            elif key == "CUDA Version":
                out.info.setdefault("cuda_version", value)
            continue
        if indent <= 4:
            section = key if not value else ""
            current.setdefault(key, value)
        current.setdefault(f"{section}.{key}", value)
    flush()


def parse(text: str | None) -> Parsed[NvidiaGpu]:
    def body(clean_text: str, out: Parsed[NvidiaGpu]) -> None:
        failure = _FAILURE.search(clean_text)
        if failure:
            out.errors.append(f"nvidia-smi: {failure.group(1).strip()[:160]}")
        if "NVSMI LOG" in clean_text or "Product Name" in clean_text:
            _parse_query(clean_text, out)
        elif "|" in clean_text and ("NVIDIA-SMI" in clean_text or "Bus-Id" in clean_text):
            _parse_table(clean_text, out)
        elif not failure:
            _parse_csv(clean_text, out)

    return safe_parse("nvidia-smi", text, body)
