"""``lspci -vvv`` read for what multi-GPU traffic cares about: bridges, their bus ranges
and their Access Control Services (ACS) settings.

ACS on a bridge (``ACSCtl: SrcValid+ ... ReqRedir+ CmpltRedir+``) sends peer-to-peer
traffic up to the root complex, where NCCL/RCCL transfers crawl or hang. Without root
``lspci`` prints ``Capabilities: <access denied>`` and the ACS lines are missing; the
parser records that rather than reporting "ACS off". Posted outputs are often partial
(``....`` where lines were cut); a block with no header line is skipped.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field

from greta_install.detection.parsers.common import clean

_HEAD = re.compile(
    r"^(?P<path>(?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]"
    r"(?:/[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])*)\s+(?P<cls>[^:\[]+?)"
    r"(?:\s*\[(?P<code>[0-9a-fA-F]{4})\])?:\s*(?P<name>.*)$"
)
_BUS = re.compile(
    r"Bus:\s*primary=([0-9a-fA-F]+),\s*secondary=([0-9a-fA-F]+),\s*subordinate=([0-9a-fA-F]+)"
)
_FLAG = re.compile(r"(\w+)([+-])")
_GPU_CLASSES = {
    "VGA compatible controller": "0300",
    "3D controller": "0302",
    "Display controller": "0380",
    "Processing accelerators": "1200",
}
# ACS controls that push peer-to-peer requests or completions away from the direct path.
ACS_REDIRECTING = ("SrcValid", "ReqRedir", "CmpltRedir", "UpstreamFwd", "EgressCtrl")


@dataclass
class PciFunction:
    bdf: str  # "0000:40:01.1"
    cls: str  # "PCI bridge"
    code: str | None  # "0604" when lspci printed it (-nn)
    name: str
    upstream: tuple[str, ...] = ()  # bridges above, from `lspci -PP` paths
    bus_range: tuple[int, int] | None = None  # (secondary, subordinate) for a bridge
    acs_ctl: dict[str, bool] | None = None
    caps_denied: bool = False
    numa_node: int | None = None
    extra: list[str] = field(default_factory=list)

    @property
    def domain(self) -> str:
        return self.bdf.split(":")[0]

    @property
    def bus(self) -> int:
        return int(self.bdf.split(":")[1], 16)

    @property
    def is_bridge(self) -> bool:
        return self.code == "0604" or self.cls.strip() == "PCI bridge"

    @property
    def is_gpu(self) -> bool:
        return self.code in _GPU_CLASSES.values() or self.cls.strip() in _GPU_CLASSES

    @property
    def acs_redirects(self) -> list[str]:
        return [k for k in ACS_REDIRECTING if (self.acs_ctl or {}).get(k)]


def _bdf(short: str) -> str:
    return short.lower() if short.count(":") == 2 else f"0000:{short.lower()}"


def parse_lspci_vvv(text: str | None) -> list[PciFunction]:
    functions: list[PciFunction] = []
    current: PciFunction | None = None
    for raw in clean(text).splitlines():
        line = raw.rstrip()
        if not line.strip():
            continue
        if not line[0].isspace():
            match = _HEAD.match(line)
            if match:
                hops = match["path"].split("/")
                current = PciFunction(
                    bdf=_bdf(hops[-1]),
                    cls=match["cls"].strip(),
                    code=match["code"],
                    name=match["name"].strip(),
                    upstream=tuple(_bdf(h) for h in hops[:-1]),
                )
                functions.append(current)
            # Any other unindented line ("....", prose) keeps the block it interrupts.
            continue
        if current is None:
            continue
        body = line.strip()
        if (bus := _BUS.search(body)) is not None:
            current.bus_range = (int(bus[2], 16), int(bus[3], 16))
        elif body.startswith("ACSCtl:"):
            current.acs_ctl = {k: v == "+" for k, v in _FLAG.findall(body[len("ACSCtl:") :])}
        elif body.startswith("Capabilities: <access denied>"):
            current.caps_denied = True
        elif body.startswith("NUMA node:"):
            with contextlib.suppress(ValueError):
                current.numa_node = int(body.split(":", 1)[1])
    return functions


def bridges_above(functions: list[PciFunction], gpu: PciFunction) -> list[PciFunction]:
    """The bridges on the path from the root complex down to ``gpu``."""
    by_bdf = {f.bdf: f for f in functions}
    if gpu.upstream:
        return [by_bdf[b] for b in gpu.upstream if b in by_bdf and by_bdf[b].is_bridge]
    return [
        f
        for f in functions
        if f.is_bridge
        and f.bus_range is not None
        and f.domain == gpu.domain
        and f.bus_range[0] <= gpu.bus <= f.bus_range[1]
    ]
