"""GPU-to-GPU link matrices from the three vendor tools, read into one shape.

- ``nvidia-smi topo -m``: ``GPU0  X  NV18 ... CPU Affinity  NUMA Affinity`` rows;
- ``rocm-smi --showtopo``: ``Link Type between two GPUs`` / ``Hops ...`` blocks and
  ``GPU[0] : (Topology) Numa Node: 0`` lines;
- ``amd-smi topology``: ``LINK TYPE TABLE:`` / ``HOPS TABLE:`` blocks keyed by BDF;
- ``nvidia-smi topo -p2p r``: the peer-access matrix (``OK``, ``GNS``, ``CNS``, ...).

Posted outputs are partial, re-indented (tabs turned to spaces) or coloured; every
parser returns None when it finds no matrix instead of guessing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from greta_install.detection.parsers.common import clean

Pair = tuple[int, int]

_NV_HEADER = re.compile(r"GPU\d+|NIC\d+|mlx\d+_\d+|CPU Affinity|NUMA Affinity|GPU NUMA ID")
_NV_DEVICE = re.compile(r"^(GPU\d+|NIC\d+|mlx\d+_\d+)$")
_NV_LINK = re.compile(r"^NV(\d+)$")
_PCIE_PATHS = frozenset({"PIX", "PXB", "PHB", "NODE", "SYS", "SOC"})
_ROCM_NUMA = re.compile(r"GPU\[(\d+)\]\s*:\s*\(Topology\)\s*Numa Node:\s*(-?\d+)")
_BDF = re.compile(r"^(?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")


@dataclass(frozen=True)
class Topology:
    """Links between GPUs i and j (i != j) as ``kinds[(i, j)]``: nvlink, xgmi or pcie."""

    source: str
    gpus: tuple[str, ...]  # labels as the tool prints them: "GPU0", "0000:0c:00.0"
    kinds: dict[Pair, str] = field(default_factory=dict)
    raw: dict[Pair, str] = field(default_factory=dict)  # "NV18", "SYS", "XGMI", ...
    hops: dict[Pair, int] = field(default_factory=dict)
    numa: dict[int, int | None] = field(default_factory=dict)  # GPU index -> NUMA node

    @property
    def count(self) -> int:
        return len(self.gpus)

    def pairs(self) -> list[Pair]:
        """Each unordered pair once, in order, for the pairs the tool reported."""
        return sorted((i, j) for (i, j) in self.kinds if i < j)

    def pairs_of(self, kind: str) -> list[Pair]:
        return [p for p in self.pairs() if self.kinds[p] == kind]

    def cross_socket(self) -> list[Pair]:
        """Pairs whose PCIe path crosses the CPU interconnect (SYS, or 3 hops on AMD)."""
        out = []
        for p in self.pairs():
            if self.kinds[p] != "pcie":
                continue
            if self.raw.get(p) in ("SYS", "SOC") or self.hops.get(p, 0) >= 3:
                out.append(p)
        return out


def _kind(value: str) -> str | None:
    value = value.strip().upper()
    if _NV_LINK.match(value):
        return "nvlink"
    if value in _PCIE_PATHS or value == "PCIE":
        return "pcie"
    if value == "XGMI":
        return "xgmi"
    return None


def _int(value: str) -> int | None:
    try:
        return int(value.strip())
    except ValueError:
        return None


def parse_nvidia_topo(text: str | None) -> Topology | None:
    """``nvidia-smi topo -m`` (the GPU rows; NIC rows and the legend are ignored)."""
    lines = clean(text).splitlines()
    # The header names every column; a row names only itself.
    headers = [(n, _NV_HEADER.findall(line)) for n, line in enumerate(lines)]
    start, columns = next(((n, c) for n, c in headers if len(c) >= 2 and c[0] == "GPU0"), (0, []))
    if not columns:
        return None
    devices = [c for c in columns if _NV_DEVICE.match(c)]
    gpus = tuple(d for d in devices if d.startswith("GPU"))
    topo = Topology("nvidia-smi topo -m", gpus)
    for line in lines[start + 1 :]:
        # Tab-separated output keeps empty cells (a blank CPU affinity); pasted copies
        # lose the tabs, but then no cell is empty.
        cells = [c.strip() for c in line.split("\t")] if "\t" in line else line.split()
        if not cells or not re.match(r"^GPU\d+$", cells[0]):
            if cells and cells[0].startswith("Legend"):
                break
            continue
        row = int(cells[0][3:])
        values = cells[1 : 1 + len(devices)]
        for col, value in zip(devices, values, strict=False):
            if not col.startswith("GPU") or value.upper() == "X":
                continue
            kind = _kind(value)
            if kind:
                pair = (row, int(col[3:]))
                topo.kinds[pair], topo.raw[pair] = kind, value
        tail = cells[1 + len(devices) :]
        if "NUMA Affinity" in columns and len(tail) >= 2:
            topo.numa[row] = _int(tail[1]) if tail[1] not in ("", "N/A") else None
    return topo if topo.kinds else None


def _matrix_rows(lines: list[str], start: int) -> tuple[list[str], list[list[str]]]:
    """The header labels and the rows of a square table beginning after ``start``."""
    header: list[str] = []
    rows: list[list[str]] = []
    for line in lines[start + 1 :]:
        cells = line.split()
        if not cells:
            if header and rows:
                break
            continue
        if not header:
            if all(c.startswith("GPU") or _BDF.match(c) for c in cells):
                header = cells
                continue
            break
        if cells[0] in header:
            rows.append(cells)
        else:
            break
    return header, rows


def _fill(topo: Topology, header: list[str], rows: list[list[str]], what: str) -> None:
    index = {label: i for i, label in enumerate(header)}
    for cells in rows:
        i = index[cells[0]]
        for j, value in enumerate(cells[1 : 1 + len(header)]):
            if i == j:
                continue
            if what == "kind":
                kind = _kind(value)
                if kind:
                    topo.kinds[(i, j)], topo.raw[(i, j)] = kind, value
            elif (hops := _int(value)) is not None:
                topo.hops[(i, j)] = hops


def _parse_blocks(text: str | None, source: str, titles: dict[str, str]) -> Topology | None:
    lines = clean(text).splitlines()
    topo: Topology | None = None
    for n, line in enumerate(lines):
        what = next((w for title, w in titles.items() if title in line), None)
        if what is None:
            continue
        header, rows = _matrix_rows(lines, n)
        if not header or not rows:
            continue
        if topo is None:
            topo = Topology(source, tuple(header))
        if tuple(header) == topo.gpus:
            _fill(topo, header, rows, what)
    return topo


def parse_rocm_smi_topo(text: str | None) -> Topology | None:
    """``rocm-smi --showtopo``: link types, hops and NUMA nodes."""
    titles = {"Link Type between two GPUs": "kind", "Hops between two GPUs": "hops"}
    topo = _parse_blocks(text, "rocm-smi --showtopo", titles)
    if topo is None:
        return None
    for gpu, node in _ROCM_NUMA.findall(clean(text)):
        topo.numa[int(gpu)] = int(node) if int(node) >= 0 else None
    return topo if topo.kinds else None


def parse_amd_smi_topology(text: str | None) -> Topology | None:
    """``amd-smi topology``: the LINK TYPE and HOPS tables."""
    titles = {"LINK TYPE TABLE": "kind", "HOPS TABLE": "hops"}
    topo = _parse_blocks(text, "amd-smi topology", titles)
    return topo if topo is not None and topo.kinds else None


def parse_amd_topology(amd_smi: str | None, rocm_smi: str | None) -> Topology | None:
    """amd-smi's tables when it printed them, else rocm-smi's (older ROCm)."""
    return parse_amd_smi_topology(amd_smi) or parse_rocm_smi_topo(rocm_smi)


def parse_nvidia_p2p(text: str | None) -> dict[Pair, str] | None:
    """``nvidia-smi topo -p2p r``: ``{(i, j): "OK" | "GNS" | "CNS" | ...}``."""
    lines = clean(text).splitlines()
    header: list[str] = []
    out: dict[Pair, str] = {}
    for line in lines:
        cells = line.split()
        if not cells:
            continue
        if not header and all(re.match(r"^GPU\d+$", c) for c in cells):
            header = cells
            continue
        if header and re.match(r"^GPU\d+$", cells[0]):
            row = int(cells[0][3:])
            for col, value in zip(header, cells[1:], strict=False):
                if value != "X":
                    out[(row, int(col[3:]))] = value
        elif header and out:
            break
    return out or None
