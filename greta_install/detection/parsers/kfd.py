"""KFD topology: /sys/class/kfd/kfd/topology/nodes/N/properties.

One node per file, "key value" lines. GPU nodes carry ``gfx_target_version``
(major*10000 + minor*100 + stepping; absent on old kernels), ``vendor_id`` and
``device_id`` in decimal. CPU nodes have ``simd_count 0``. This comes from the
kernel, so ``HSA_OVERRIDE_GFX_VERSION`` does not change it.
"""

from __future__ import annotations

from dataclasses import dataclass

from greta_install.detection.parsers.common import Parsed, bus_from_location, hex_id, safe_parse

AMD_VENDOR_ID = 0x1002


@dataclass(frozen=True)
class KfdNode:
    node: str
    is_gpu: bool
    gfx: str | None  # from gfx_target_version; None when absent or 0
    vendor_id: int | None
    device_id: str | None  # "0x74a1"
    pci_bus: str | None
    simd_count: int | None
    compute_units: int | None
    num_xcc: int | None
    name: str | None = None  # the node's `name` file, e.g. "gfx942" or "ip discovery"
    gpu_id: int | None = None


def gfx_from_target_version(value: int | None) -> str | None:
    """90402 -> "gfx942", 90010 -> "gfx90a", 110501 -> "gfx1151"; 0/None -> None."""
    if not value or value < 0:
        return None
    major, minor, step = value // 10000, (value // 100) % 100, value % 100
    if major == 0 or minor > 15 or step > 15:
        return None
    return f"gfx{major}{minor:x}{step:x}"


def parse(
    text: str | None, node: str = "?", name: str | None = None, gpu_id: str | None = None
) -> Parsed[KfdNode]:
    def body(clean_text: str, out: Parsed[KfdNode]) -> None:
        values: dict[str, int] = {}
        for lineno, line in enumerate(clean_text.splitlines(), 1):
            if not line.strip():
                continue
            parts = line.split()
            if len(parts) != 2:
                out.problems.append(f"kfd node {node} line {lineno}: unexpected {line[:60]!r}")
                continue
            key, raw = parts
            if raw == "REDACTED":  # `greta snapshot` hides unique_id
                continue
            try:
                values[key] = int(raw)
            except ValueError:
                out.problems.append(
                    f"kfd node {node} line {lineno}: {key} is not a number: {raw[:40]!r}"
                )
        if not values:
            return
        simd = values.get("simd_count")
        per_cu = values.get("simd_per_cu")
        is_gpu = bool(simd) and simd is not None and simd > 0
        cus = simd // per_cu if is_gpu and simd and per_cu else None
        location = values.get("location_id")
        domain = values.get("domain")
        if domain is not None and not 0 <= domain <= 0xFFFF:
            domain = None
        # Old kernels have no `domain` line; the PCI domain is then 0 on every
        # machine we have seen, but do not invent one.
        out.records.append(
            KfdNode(
                node=node,
                is_gpu=is_gpu,
                gfx=gfx_from_target_version(values.get("gfx_target_version")),
                vendor_id=values.get("vendor_id"),
                device_id=hex_id(values.get("device_id")) if is_gpu else None,
                pci_bus=bus_from_location(location, domain) if is_gpu else None,
                simd_count=simd,
                compute_units=cus,
                num_xcc=values.get("num_xcc"),
                name=(name or "").strip() or None,
                gpu_id=_int_or_none(gpu_id),
            )
        )

    return safe_parse("kfd", text, body)


def _int_or_none(text: str | None) -> int | None:
    try:
        return int((text or "").strip())
    except ValueError:
        return None
