"""Property tests: truncated, garbled and binary input never makes detection raise.

Every parser gets real fixture text cut short or corrupted, arbitrary text, and binary
junk; detection through a fake view must still answer and name the source it could
not read.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import SNAPSHOTS
from fake_view import FakeView
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from greta_install.detection.detect import conclude
from greta_install.detection.evidence import gather
from greta_install.detection.parsers import (
    amd_smi,
    drm,
    kfd,
    lspci,
    nvidia_proc,
    nvidia_smi,
    rocm_smi,
    rocm_version,
    rocminfo,
)
from greta_install.detection.parsers.common import Parsed
from greta_install.model import TARGETS

FUZZ = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)


def _fixture(rel: str) -> str:
    return (SNAPSHOTS / rel).read_text(encoding="utf-8")


KFD_SAMPLE = _fixture("mi210-kfd/sys/class/kfd/kfd/topology/nodes/2/properties")
SAMPLES: dict[str, str] = {
    "kfd": KFD_SAMPLE,
    "lspci": _fixture("mi300x-pf-host/lspci.txt"),
    "rocminfo": _fixture("strix-halo/rocminfo.txt"),
    "rocm-smi": _fixture("mi300x-x4/rocm-smi.txt")[:6000],
    "amd-smi": _fixture("mi300a-x4-amdsmi/amd-smi.txt")[:5000],
    "nvidia-smi": _fixture("h100-x8/nvidia-smi.txt"),
    "nvidia-proc": "NVRM version: NVIDIA UNIX x86_64 Kernel Module  565.57.01  Thu Oct 10 2024\n",
    "rocm-version": "6.4.1-120\n",
    "hipconfig": "6.4.43484-123eb5128\n",
    "drm": "0x1002\n",
}

PARSERS: dict[str, Callable[[str], Parsed]] = {
    "kfd": lambda t: kfd.parse(t, "1"),
    "lspci": lspci.parse,
    "rocminfo": rocminfo.parse,
    "rocm-smi": rocm_smi.parse,
    "amd-smi": amd_smi.parse,
    "nvidia-smi": nvidia_smi.parse,
    "nvidia-proc": nvidia_proc.parse,
    "rocm-version": rocm_version.parse_info_version,
    "hipconfig": rocm_version.parse_hipconfig,
    "drm": lambda t: drm.parse_card("card0", {"vendor": t, "device": t, "uevent": t}),
}


@st.composite
def corrupted(draw: st.DrawFn, sample: str) -> str:
    """The sample cut short, with random spans replaced, or replaced by binary junk."""
    kind = draw(st.sampled_from(["truncate", "garble", "binary", "text"]))
    if kind == "truncate":
        return sample[: draw(st.integers(0, len(sample)))]
    if kind == "binary":
        # As the system view decodes it: undecodable bytes become U+FFFD.
        return draw(st.binary(max_size=2000)).decode("utf-8", errors="replace")
    if kind == "text":
        return draw(st.text(max_size=500))
    text = sample
    for _ in range(draw(st.integers(1, 8))):
        start = draw(st.integers(0, len(text)))
        end = draw(st.integers(start, min(len(text), start + 40)))
        junk = draw(
            st.text(max_size=20) | st.sampled_from(["\x00", "\x1b[31m", "N/A", ":", "0x", "\n"])
        )
        text = text[:start] + junk + text[end:]
    return text


def _check_parsed(result: Parsed) -> None:
    assert isinstance(result, Parsed)
    assert isinstance(result.records, list)
    assert all(isinstance(p, str) for p in result.problems + result.errors)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in result.info.items())


@pytest.mark.parametrize("source", sorted(PARSERS))
def test_parser_never_raises(source: str) -> None:
    @FUZZ
    @given(text=corrupted(SAMPLES[source]))
    def check(text: str) -> None:
        _check_parsed(PARSERS[source](text))

    check()


def _view_with(source: str, text: str) -> FakeView:
    """A machine whose only evidence for `source` is `text` (plus a sane GPU elsewhere)."""
    files: dict[str, str] = {}
    tools: dict[str, str] = {}
    nodes = "/sys/class/kfd/kfd/topology/nodes"
    if source == "kfd":
        files[f"{nodes}/1/properties"] = text
    else:
        files[f"{nodes}/1/properties"] = KFD_SAMPLE
    if source == "drm":
        for name in ("vendor", "device", "uevent", "mem_info_vram_total"):
            files[f"/sys/class/drm/card0/device/{name}"] = text
    elif source == "nvidia-proc":
        files["/proc/driver/nvidia/version"] = text
    elif source == "rocm-version":
        files["/opt/rocm/.info/version"] = text
    elif source != "kfd":
        tools[source] = text
    return FakeView(files=files, tools=tools)


def _check_detection(source: str, view: FakeView) -> None:
    det = conclude(gather(view))
    assert det.target in TARGETS
    assert det.primary is None or 0 <= det.primary < len(det.gpus)
    json.dumps(det.to_json())
    status = det.sources[source]
    if status.startswith(("garbled", "error")):
        assert any(source in w for w in det.warnings), (status, det.warnings)


@pytest.mark.parametrize("source", sorted(SAMPLES))
def test_detect_never_raises_and_names_the_bad_source(source: str) -> None:
    @FUZZ
    @given(text=corrupted(SAMPLES[source]))
    def check(text: str) -> None:
        _check_detection(source, _view_with(source, text))

    check()


JUNK = bytes(range(256)).decode("utf-8", errors="replace") * 4


@pytest.mark.parametrize("source", sorted(SAMPLES))
def test_binary_junk_is_reported_per_source(source: str) -> None:
    det = conclude(gather(_view_with(source, JUNK)))
    assert det.sources[source].startswith("garbled"), det.sources
    assert any(w.startswith(source) for w in det.warnings), det.warnings
    # The good KFD node still gives the GPU, except when KFD itself is the junk.
    if source != "kfd":
        assert det.arch == "gfx90a" and det.target == "instinct"


@pytest.mark.parametrize("name", sorted(p.name for p in SNAPSHOTS.iterdir() if p.is_dir()))
def test_truncated_snapshot_files_still_detect(name: str, tmp_path: Path) -> None:
    """Every file of a real snapshot cut in half: detection still answers."""
    from greta_install.detection.detect import detect
    from greta_install.detection.system_view import SnapshotSystem

    for src in (SNAPSHOTS / name).rglob("*"):
        if src.is_file() and src.name != "expected.json":
            dest = tmp_path / src.relative_to(SNAPSHOTS / name)
            dest.parent.mkdir(parents=True, exist_ok=True)
            data = src.read_bytes()
            dest.write_bytes(data[: len(data) // 2])
    det = detect(SnapshotSystem(tmp_path))
    assert det.target in TARGETS
    json.dumps(det.to_json())
