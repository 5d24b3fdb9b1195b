"""GRETA's gfx facts against AMD's own detector, rocm-bootstrap 0.3.0 (PyPI).

rocm-bootstrap carries no PCI-id table: it reads ``gfx_target_version`` from KFD sysfs
and maps it through its table of 33 gfx targets. So the cross-check is of that table
(every target decodes to the same name through GRETA's KFD and rocm-smi decoders, and
GRETA's arch table has it or a recorded reason) and of the two device ids it pairs with
a target in its tests (GRETA's PCI table gives the same gfx). The facts are extracted
into tests/data/rocm_bootstrap/ with their source; no code of it is used.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from greta_install import archs
from greta_install.detection import pci_ids
from greta_install.detection.parsers.kfd import gfx_from_target_version
from greta_install.detection.parsers.rocm_smi import gfx_from_decimal

DATA = Path(__file__).parent / "data" / "rocm_bootstrap"


def _rows(name: str) -> list[dict[str, str]]:
    lines = [ln for ln in (DATA / name).read_text().splitlines() if not ln.startswith("#")]
    return list(csv.DictReader(lines))


TARGETS = [r for r in _rows("targets.csv") if not r["name"].endswith("-strict")]


def test_the_table_is_the_one_we_read() -> None:
    assert len(TARGETS) == 33


@pytest.mark.parametrize("row", TARGETS, ids=lambda r: r["name"])
def test_target_decodes_the_same_in_greta(row: dict[str, str]) -> None:
    name = row["name"]
    major, minor, step = int(row["major"]), int(row["minor"]), int(row["stepping"])
    assert int(row["gfx_target_version"]) == major * 10000 + minor * 100 + step
    # KFD sysfs spelling
    assert gfx_from_target_version(int(row["gfx_target_version"])) == name
    # rocm-smi's "GFX Version" spelling: the three numbers in decimal, one after another
    assert gfx_from_decimal(f"gfx{major}{minor}{step}") == name


@pytest.mark.parametrize("row", TARGETS, ids=lambda r: r["name"])
def test_greta_arch_table_has_it_or_says_why(row: dict[str, str]) -> None:
    known = archs.family(row["name"]) is not None
    assert known != bool(row["greta_reason"]), row


@pytest.mark.parametrize("row", _rows("device_ids.csv"), ids=lambda r: r["device_id"])
def test_device_ids_map_to_the_same_gfx(row: dict[str, str]) -> None:
    info = pci_ids.lookup(row["device_id"])
    assert info is not None and info.gfx == row["gfx"]
