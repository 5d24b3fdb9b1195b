"""Shared helpers for the parsers: the result type and input cleaning."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")

# CSI sequences (colours, cursor moves) and lone escape bytes: rocminfo colours its
# first lines and `watch` captures keep terminal control codes.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-_]?")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_BINARY = "\ufffd" + "".join(chr(c) for c in range(32) if chr(c) not in "\n\t\r")


@dataclass
class Parsed(Generic[T]):
    """What one parser could read: records plus the problems it met."""

    records: list[T] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    info: dict[str, str] = field(default_factory=dict)  # machine-wide facts (versions)
    errors: list[str] = field(default_factory=list)  # failures the tool itself reported


def clean(text: str | None) -> str:
    """Text without terminal escapes, NULs and carriage returns."""
    if not text:
        return ""
    text = _ANSI.sub("", text)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _CONTROL.sub("", text)


def looks_binary(text: str) -> bool:
    """True when the text is mostly undecodable or control bytes (not tool output)."""
    if not text:
        return False
    bad = sum(text.count(ch) for ch in _BINARY)  # counted in C: linear, and fast
    return bad * 10 > len(text)


def safe_parse(name: str, text: str | None, body: Callable[[str, Parsed[T]], None]) -> Parsed[T]:
    """Run ``body`` on cleaned text; turn any exception into a problem, keep partial records.

    A parser bug must never take detection down: the records read before the failure
    are still good evidence.
    """
    out: Parsed[T] = Parsed()
    raw = text or ""
    if looks_binary(raw):
        out.problems.append(f"{name}: output is binary, not text ({len(raw)} characters)")
        return out
    try:
        body(clean(raw), out)
    except Exception as exc:  # parsers are pure; any failure is a bug or bizarre input
        out.problems.append(
            f"{name}: could not read past {len(out.records)} record(s): "
            f"{exc.__class__.__name__}: {exc}"
        )
    if raw.strip() and not (out.records or out.info or out.problems or out.errors):
        out.problems.append(f"{name}: no recognisable {name} output in {len(raw)} characters")
    return out


def to_int(value: str | None, base: int = 10) -> int | None:
    """An integer or None; accepts "0x"-prefixed hex whatever the base."""
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    try:
        if value.lower().startswith("0x"):
            return int(value, 16)
        return int(value, base)
    except ValueError:
        return None


_HEX_ID = re.compile(r"(?:0x)?([0-9a-fA-F]{1,4})$")


def hex_id(value: int | str | None) -> str | None:
    """A PCI device id in the canonical form "0x74a1"."""
    if value is None:
        return None
    if isinstance(value, int):
        if 0 <= value <= 0xFFFF:
            return f"0x{value:04x}"
        return None
    match = _HEX_ID.match(value.strip())
    if not match:
        return None
    return f"0x{int(match.group(1), 16):04x}"


_BUS = re.compile(
    r"(?:(?P<domain>[0-9a-fA-F]{4,8}):)?(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})\.(?P<fn>[0-7])"
)


def pci_bus(value: str | None) -> str | None:
    """Normalise a PCI address: "00000000:18:00.0" -> "0000:18:00.0"; "c5:00.0" stays."""
    if not value:
        return None
    match = _BUS.search(value.strip())
    if not match:
        return None
    body = f"{match['bus']}:{match['dev']}.{match['fn']}".lower()
    domain = match["domain"]
    if domain is None:
        return body
    return f"{int(domain, 16):04x}:{body}"


def bus_from_location(location: int | None, domain: int | None = None) -> str | None:
    """PCI address from a KFD location_id / rocminfo BDFID ((bus<<8)|(dev<<3)|fn)."""
    if location is None or location <= 0 or location > 0xFFFF:
        return None
    bus, dev, fn = location >> 8, (location >> 3) & 0x1F, location & 0x7
    body = f"{bus:02x}:{dev:02x}.{fn}"
    if domain is None:
        return body
    return f"{domain:04x}:{body}"
