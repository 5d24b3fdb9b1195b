"""AMD PCI device id -> product, gfx target, family, from the table shipped as package data.

The table (``data/amd_pci_ids.csv``) names its source per row. One id can have several
rows: one product per PCI revision, or sources that disagree; conflicts are noted in
the product text as ``[NOTE ...]`` and come back in ``PciInfo.note``.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

_REV = re.compile(r"\s*\[rev 0x([0-9a-fA-F]{1,2})\]")
_NOTE = re.compile(r"\s*\[NOTE[^\]]*\]")
_PCI_IDS_NAME = re.compile(r"\s*\((?:pci\.ids[^)]*|SR-IOV[^)]*)\)")


@dataclass(frozen=True)
class PciRow:
    device_id: str  # "0x74a1"
    product: str  # cleaned
    revision: int | None
    gfx: str | None
    family: str
    note: str | None
    source: str


@dataclass(frozen=True)
class PciInfo:
    product: str
    gfx: str | None
    family: str
    note: str | None = None  # disagreement between sources, if any


def _clean_product(raw: str) -> str:
    text = _NOTE.sub("", _REV.sub("", raw))
    text = _PCI_IDS_NAME.sub("", text)
    return text.replace("(TM)", "").replace("  ", " ").strip()


def _row(record: dict[str, str]) -> PciRow | None:
    raw_id = (record.get("device_id") or "").strip().lower()
    if not re.fullmatch(r"0x[0-9a-f]{4}", raw_id):
        return None
    product_raw = record.get("product") or ""
    rev = _REV.search(product_raw)
    note = _NOTE.search(product_raw)
    gfx = (record.get("gfx_target") or "").strip() or None
    return PciRow(
        device_id=raw_id,
        product=_clean_product(product_raw),
        revision=int(rev.group(1), 16) if rev else None,
        gfx=gfx,
        family=(record.get("family") or "").strip(),
        note=note.group(0).strip(" []") if note else None,
        source=(record.get("source") or "").strip(),
    )


@lru_cache(maxsize=1)
def rows() -> tuple[PciRow, ...]:
    text = (
        resources.files("greta_install.detection.data")
        .joinpath("amd_pci_ids.csv")
        .read_text("utf-8")
    )
    parsed = (_row(r) for r in csv.DictReader(io.StringIO(text)))
    return tuple(r for r in parsed if r is not None)


def _combined_name(names: list[str]) -> str:
    """ "AMD Radeon RX 7600 XT", "AMD Radeon RX 7600" -> "AMD Radeon RX 7600 XT / RX 7600"."""
    unique = list(dict.fromkeys(names))
    if len(unique) == 1:
        return unique[0]
    words = [n.split() for n in unique]
    common = 0
    while all(len(w) > common + 1 and w[common] == words[0][common] for w in words):
        common += 1
    head = " ".join(words[0][:common])
    tails = [" ".join(w[common:]) for w in words]
    return f"{head} {' / '.join(tails)}".strip()


def lookup(device_id: str | int | None, revision: int | None = None) -> PciInfo | None:
    """Product, gfx target and family for an AMD device id ("0x74a1", "74A1" or 29857)."""
    if device_id is None:
        return None
    if isinstance(device_id, int):
        key = f"0x{device_id:04x}"
    else:
        text = device_id.strip().lower()
        key = text if text.startswith("0x") else f"0x{text}"
    candidates = [r for r in rows() if r.device_id == key]
    if not candidates:
        return None
    gfxs = list(dict.fromkeys(r.gfx for r in candidates if r.gfx))
    trusted = [r for r in candidates if not r.note] or candidates
    by_rev = [r for r in trusted if revision is not None and r.revision == revision]
    if by_rev:
        chosen = by_rev
    else:
        # Rows without a revision are the generic pci.ids name for the whole id.
        generic = [r for r in trusted if r.revision is None]
        chosen = generic or trusted
    # Only the chosen rows' notes matter: a note on another revision's row is about
    # that row (e.g. device_info's MI300A label on 0x74a1 rev 1).
    notes = list(dict.fromkeys(r.note for r in chosen if r.note))
    if len(gfxs) > 1:
        notes.append(f"sources disagree on the gfx target of {key}: {', '.join(gfxs)}")
    gfx = chosen[0].gfx if len({r.gfx for r in chosen}) == 1 else None
    return PciInfo(
        product=_combined_name([r.product for r in chosen]),
        gfx=gfx or (gfxs[0] if len(gfxs) == 1 else None),
        family=chosen[0].family,
        note="; ".join(notes) if notes else None,
    )


def _codename(text: str) -> str:
    """ "Navi 31" / "RDNA3 / Navi 31" / "Phoenix1 APU" -> "navi31" / "phoenix1"."""
    text = text.split("/", 1)[1] if "/" in text else text
    text = re.sub(r"\(.*?\)", "", text).replace("APU", "")
    return re.sub(r"[^a-z0-9]", "", text.lower())


def lookup_by_name(name: str) -> tuple[str, PciInfo] | None:
    """(device id, info) for an AMD GPU known only by its lspci name (lspci without -nn).

    "Navi 31 [Radeon RX 7900 XT/7900 XTX/7900M]" names the chip (Navi 31) and the
    cards. Returns an answer only where the name identifies the arch: every table row
    of that chip has the same gfx target. The device id is the one whose product the
    bracket names, else the chip's lowest id (its product name then says which chip).
    """
    head, _, bracket = name.partition("[")
    chip = _codename(head)
    if not chip:
        return None
    candidates = [r for r in rows() if _codename(r.family) == chip]
    gfxs = {r.gfx for r in candidates if r.gfx}
    if not candidates or len(gfxs) != 1:
        return None
    wanted = [w.strip().lower() for w in re.split(r"[/,]", bracket.rstrip("] ")) if w.strip()]
    named = sorted(
        {r.device_id for r in candidates if any(w and w in r.product.lower() for w in wanted)}
    )
    if len(named) > 1:  # "Instinct MI300X" also names "... MI300X VF": prefer the exact one
        exact = sorted(
            {r.device_id for r in candidates if any(r.product.lower().endswith(w) for w in wanted)}
        )
        named = exact if len(exact) == 1 else named
    device_id = named[0] if len(named) == 1 else sorted({r.device_id for r in candidates})[0]
    info = lookup(device_id)
    if info is None:
        return None
    if len(named) != 1:
        info = PciInfo(
            product=f"AMD {head.strip()} ({bracket.rstrip('] ').strip() or 'model not named'})",
            gfx=next(iter(gfxs)),
            family=info.family,
            note="lspci without -nn: the chip is known from its name, the exact model is not",
        )
    return device_id, info


# Model names that identify one product line, as tools print them ("AMD Instinct
# MI325X", "Arcturus GL-XL [AMD Instinct MI100]", "Radeon RX 7900 XTX").
_MODEL = re.compile(
    r"\b(MI\d{2,3}[A-Z]?|RX \d{4}(?: XTX| XT| GRE)?|AI PRO R\d{4}|PRO W\d{4})\b", re.I
)


def lookup_name(name: str | None) -> PciInfo | None:
    """Product and gfx target from a product name, for tools that print no device id
    (the plain `amd-smi` table, `rocm-smi --csv` where "Card model" is a subsystem id).

    Only a name whose model token names rows of a single gfx target answers.
    """
    match = _MODEL.search(name or "")
    if not match:
        return None
    token = re.compile(rf"\b{re.escape(match.group(1))}\b", re.I)
    found = [r for r in rows() if r.gfx and token.search(r.product)]
    gfxs = {r.gfx for r in found}
    if len(gfxs) != 1:
        return None
    return PciInfo(product=found[0].product, gfx=found[0].gfx, family=found[0].family)
