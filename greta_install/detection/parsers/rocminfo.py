"""``rocminfo`` output: one block per HSA agent (CPU, GPU, and on Ryzen AI the NPU).

Old and new ROCm releases differ in spacing and in which fields exist, some captures
carry ANSI colour codes; only the agent-level "Key: value" lines are used. The gfx
name rocminfo prints is the *runtime's* view: under ``HSA_OVERRIDE_GFX_VERSION`` it is
the overridden target, not the card's own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from greta_install.detection.parsers.common import (
    Parsed,
    bus_from_location,
    hex_id,
    safe_parse,
    to_int,
)

_AGENT = re.compile(r"^\s*Agent\s+(\d+)\s*$")
_FIELD = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Za-z][^:]*?):+\s*(?P<value>.*?)\s*$")
_GFX = re.compile(r"\b(gfx[0-9a-f]{3,4})\b")
_CHIP = re.compile(r"^(\d+)\s*(?:\((0x[0-9a-fA-F]+)\))?")
_ERROR = re.compile(
    r"(hsa api call failure.*|HSA_STATUS_ERROR\w*|ROCk module is NOT loaded.*"
    r"|Unable to open /dev/kfd.*|.* is not member of .*group.*)",
    re.I,
)
# `rocminfo | grep gfx` keeps the agent's own "Name: gfx1100" line (one per GPU) and
# the ISA lines "Name: amdgcn-amd-amdhsa--gfx1100..." (not GPUs: there may be several).
_GREP_AGENT = re.compile(r"^\s*Name:\s*(gfx[0-9a-f]{3,4})\s*$")
_GREP_MARKETING = re.compile(r"^\s*Marketing Name:\s*(.+?)\s*$")
_KFD_OPEN = re.compile(r"Unable to open /dev/kfd read-write:\s*(.+?)\s*$", re.I)
_ROCK = re.compile(r"ROCk module (?:version (\S+) )?is (NOT )?loaded", re.I)


@dataclass(frozen=True)
class RocmAgent:
    index: int
    device_type: str  # "GPU", "CPU", "DSP"
    name: str | None
    marketing_name: str | None
    vendor_name: str | None
    gfx: str | None
    chip_id: str | None  # "0x74a1"
    pci_bus: str | None  # from BDFID, without domain
    compute_units: int | None
    node: int | None
    apu: bool  # "Memory Properties: APU"
    uuid: str | None = None


def _chip_id(value: str) -> str | None:
    match = _CHIP.match(value)
    if not match:
        return None
    if match.group(2):
        return hex_id(match.group(2))
    number = int(match.group(1))
    return hex_id(number) if number else None


def _agent(index: int, fields: dict[str, str], isas: list[str]) -> RocmAgent:
    name = fields.get("name")
    gfx_match = _GFX.search(name or "")
    gfx = gfx_match.group(1) if gfx_match else None
    if gfx is None:
        for isa in isas:
            found = _GFX.search(isa)
            if found and "generic" not in isa:
                gfx = found.group(1)
                break
    device_type = (fields.get("device type") or "").strip().upper() or "UNKNOWN"
    bdf = to_int((fields.get("bdfid") or "").split("(")[0])
    return RocmAgent(
        index=index,
        device_type=device_type,
        name=name or None,
        marketing_name=fields.get("marketing name") or None,
        vendor_name=fields.get("vendor name") or None,
        gfx=gfx,
        chip_id=_chip_id(fields.get("chip id", "")),
        pci_bus=bus_from_location(bdf) if device_type == "GPU" else None,
        compute_units=to_int((fields.get("compute unit") or "").split("(")[0]),
        node=to_int(fields.get("node")),
        apu="APU" in (fields.get("memory properties") or "").upper(),
        uuid=fields.get("uuid") or None,
    )


def _grep_fragment(text: str, out: Parsed[RocmAgent]) -> None:
    """GPU agents from a `rocminfo | grep` paste: one per agent-name line."""
    for line in text.splitlines():
        agent = _GREP_AGENT.match(line)
        if agent:
            out.records.append(
                RocmAgent(
                    index=len(out.records),
                    device_type="GPU",
                    name=agent.group(1),
                    marketing_name=None,
                    vendor_name=None,
                    gfx=agent.group(1),
                    chip_id=None,
                    pci_bus=None,
                    compute_units=None,
                    node=None,
                    apu=False,
                )
            )
            continue
        marketing = _GREP_MARKETING.match(line)
        if marketing and out.records and out.records[-1].marketing_name is None:
            out.records[-1] = replace(out.records[-1], marketing_name=marketing.group(1))


def parse(text: str | None) -> Parsed[RocmAgent]:
    def body(clean_text: str, out: Parsed[RocmAgent]) -> None:
        index: int | None = None
        fields: dict[str, str] = {}
        isas: list[str] = []
        in_isa = False

        def flush() -> None:
            if index is not None and fields:
                out.records.append(_agent(index, fields, isas))

        for line in clean_text.splitlines():
            error = _ERROR.search(line)
            if error:
                out.errors.append(f"rocminfo reported an error: {error.group(1).strip()[:120]}")
            kfd_open = _KFD_OPEN.search(line)
            if kfd_open:
                out.info["kfd_open_error"] = kfd_open.group(1)[:80]
            rock = _ROCK.search(line)
            if rock:
                out.info["rock_module"] = "not loaded" if rock.group(2) else "loaded"
            agent = _AGENT.match(line)
            if agent:
                flush()
                index, fields, isas, in_isa = int(agent.group(1)), {}, [], False
                continue
            if index is None:
                field = _FIELD.match(line)
                if field and field["key"].strip().lower() == "runtime version":
                    out.info["runtime_version"] = field["value"]
                continue
            field = _FIELD.match(line)
            if not field:
                continue
            key = field["key"].strip().lower()
            if key == "isa info":
                in_isa = True
                continue
            if in_isa and key == "name":
                isas.append(field["value"])
                continue
            # The first occurrence wins: nested "Name:" lines (ISA, pools) come later,
            # and some captures lose the indentation that would tell them apart.
            fields.setdefault(key, field["value"])
        flush()
        if index is None:
            _grep_fragment(clean_text, out)
        if index is None and not out.records and clean_text.strip() and not out.errors:
            out.problems.append("rocminfo: no 'Agent N' blocks found")

    return safe_parse("rocminfo", text, body)
