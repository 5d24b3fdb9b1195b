"""Property tests over the tool-output readers (issue 27): whatever a user pastes, no crash
and no GPU that the paste does not show.

Inputs: arbitrary bytes, every real snapshot's tool output cut at any point, with mixed
line endings and with ANSI colour codes around its lines. A fixed, derandomized profile
keeps the run to a few seconds and the same on every machine.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from conftest import SNAPSHOTS
from fake_view import FakeView
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from greta_install.detection.detect import conclude
from greta_install.detection.evidence import gather
from greta_install.detection.parsers import amd_smi, lspci, nvidia_smi, rocm_smi, rocminfo
from greta_install.detection.parsers.common import Parsed

PROFILE = settings(
    max_examples=12,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

PARSERS: dict[str, Callable[[str], Parsed]] = {
    "rocm-smi": rocm_smi.parse,
    "amd-smi": amd_smi.parse,
    "rocminfo": rocminfo.parse,
    "nvidia-smi": nvidia_smi.parse,
    "lspci": lspci.parse,
}

# Every real paste of these tools in the snapshot set: (tool, snapshot, text).
PASTES = [
    (tool, d.name, (d / f"{tool}.txt").read_text(encoding="utf-8"))
    for d in sorted(SNAPSHOTS.iterdir())
    for tool in PARSERS
    if (d / f"{tool}.txt").is_file()
]
ANSI = st.sampled_from(["\x1b[0m", "\x1b[1;32m", "\x1b[33m", "\x1b[K", "\x1b[2J\x1b[H"])


def _gpus(tool: str, text: str) -> list[tuple]:
    """What detection makes of this one paste: (vendor, bus, device id, arch) per GPU."""
    det = conclude(gather(FakeView(tools={tool: text})))
    return [(g.vendor, g.pci_bus, g.pci_id, g.arch) for g in det.gpus]


def _hexes(text: str) -> set[str]:
    return {m.lower().lstrip("0") for m in re.findall(r"[0-9a-fA-F]{3,4}", text)}


@pytest.mark.parametrize("tool", sorted(PARSERS))
def test_any_bytes_never_crash_nor_invent_an_identity(tool: str) -> None:
    @PROFILE
    @given(raw=st.binary(max_size=2000))
    def check(raw: bytes) -> None:
        text = raw.decode("utf-8", errors="replace")
        result = PARSERS[tool](text)
        assert isinstance(result.records, list)
        for _vendor, _bus, pci_id, _arch in _gpus(tool, text):
            # a device id can only come from the paste itself
            assert pci_id is None or pci_id[2:].lstrip("0") in _hexes(text)

    check()


@pytest.mark.parametrize(("tool", "name", "text"), PASTES, ids=[f"{n}:{t}" for t, n, _ in PASTES])
def test_a_cut_paste_shows_no_more_than_the_whole(tool: str, name: str, text: str) -> None:
    whole = _gpus(tool, text)
    buses = {g[1] for g in whole}
    ids = {g[2] for g in whole}
    arches = {g[3] for g in whole}

    @PROFILE
    @given(cut=st.integers(min_value=0, max_value=len(text)))
    def check(cut: int) -> None:
        part = _gpus(tool, text[:cut])
        assert len(part) <= len(whole)
        for _vendor, bus, pci_id, arch in part:
            assert bus is None or bus in buses
            assert pci_id is None or pci_id in ids
            assert arch is None or arch in arches

    check()


@pytest.mark.parametrize(("tool", "name", "text"), PASTES, ids=[f"{n}:{t}" for t, n, _ in PASTES])
def test_line_endings_and_colour_codes_change_nothing(tool: str, name: str, text: str) -> None:
    whole = _gpus(tool, text)

    @PROFILE
    @given(
        endings=st.lists(st.sampled_from(["\n", "\r\n", "\r"]), min_size=1, max_size=4),
        colours=st.lists(ANSI, min_size=1, max_size=4),
    )
    def check(endings: list[str], colours: list[str]) -> None:
        out = []
        for i, line in enumerate(text.split("\n")):
            colour = colours[i % len(colours)]
            out.append(f"{colour}{line}\x1b[0m" if i % 2 else line)
            out.append(endings[i % len(endings)])
        assert _gpus(tool, "".join(out)) == whole

    check()
