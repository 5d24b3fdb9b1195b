"""Pure facts about GPU architectures: families, wave sizes, targets, override rules.

Sources: LLVM AMDGPUUsage processor table (gfx names, APUs, wave sizes), the gfx lists
of the PyTorch ROCm wheels recorded in DESIGN.md, NVIDIA's compute-capability table
(developer.nvidia.com/cuda-gpus).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from greta_install.model import Target

# gfx -> family. Ranges follow LLVM's processor table.
_FAMILIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("GCN5 (Vega)", ("gfx900", "gfx902", "gfx904", "gfx906", "gfx909", "gfx90c")),
    ("CDNA1", ("gfx908",)),
    ("CDNA2", ("gfx90a",)),
    ("CDNA3", ("gfx940", "gfx941", "gfx942")),
    ("CDNA4", ("gfx950",)),
    ("RDNA1", ("gfx1010", "gfx1011", "gfx1012", "gfx1013")),
    (
        "RDNA2",
        ("gfx1030", "gfx1031", "gfx1032", "gfx1033", "gfx1034", "gfx1035", "gfx1036", "gfx1037"),
    ),
    ("RDNA3", ("gfx1100", "gfx1101", "gfx1102", "gfx1103")),
    ("RDNA3.5", ("gfx1150", "gfx1151", "gfx1152", "gfx1153")),
    ("RDNA4", ("gfx1200", "gfx1201")),
)
FAMILY: dict[str, str] = {gfx: fam for fam, gfxs in _FAMILIES for gfx in gfxs}

# Client APUs whose GPU shares system memory (LLVM marks them "APU").
INTEGRATED_GFX: frozenset[str] = frozenset(
    {"gfx902", "gfx909", "gfx90c", "gfx1013", "gfx1033", "gfx1035", "gfx1036", "gfx1037",
     "gfx1103", "gfx1150", "gfx1151", "gfx1152", "gfx1153"}
)  # fmt: skip

# MI300A is an APU too, but a datacenter one with 128 GB HBM: it is not the small
# iGPU that "prefer the discrete GPU" is about.
DATACENTER_APU_IDS: frozenset[str] = frozenset({"0x74a0"})
SRIOV_VF_IDS: frozenset[str] = frozenset({"0x74b5", "0x74b9"})

# XCDs per full device, to recognise a KFD node that is one compute partition.
XCC_PER_DEVICE: dict[str, int] = {"0x74a1": 8, "0x74a5": 8, "0x74a2": 4, "0x74a0": 6}

_TARGETS: dict[str, Target] = {
    "gfx940": "mi300x",
    "gfx941": "mi300x",
    "gfx942": "mi300x",
    "gfx908": "instinct",
    "gfx90a": "instinct",
    "gfx950": "instinct",
    **{
        g: "radeon"
        for g in ("gfx1030", "gfx1031", "gfx1032", "gfx1033", "gfx1034", "gfx1035", "gfx1036")
    },
    **{g: "radeon" for g in ("gfx1100", "gfx1101", "gfx1102", "gfx1103")},
    **{g: "radeon" for g in ("gfx1150", "gfx1151", "gfx1152", "gfx1153")},
    **{g: "radeon" for g in ("gfx1200", "gfx1201")},
}


def family(gfx: str | None) -> str | None:
    return FAMILY.get(gfx or "")


def wave_size(gfx: str | None) -> int | None:
    """Default wavefront size: 64 on GCN/CDNA, 32 on RDNA."""
    fam = family(gfx)
    if fam is None:
        return None
    return 32 if fam.startswith("RDNA") else 64


def is_integrated(gfx: str | None) -> bool:
    return (gfx or "") in INTEGRATED_GFX


def target_for_gfx(gfx: str | None) -> Target | None:
    """The lock target for an AMD arch, None when GRETA has no target for it."""
    return _TARGETS.get(gfx or "")


def unsupported_reason(gfx: str | None) -> str:
    """Why an AMD arch has no GRETA target (for the warning)."""
    fam = family(gfx)
    if gfx is None:
        return "its architecture could not be determined"
    if fam == "GCN5 (Vega)":
        # ROCm 6.3/6.4 torch wheels still carry gfx900/gfx906, but AMD ended ROCm
        # support for GCN5 and GRETA's locks (ROCm 7.x) and kernel wheels do not
        # cover it: a lock that might install and then fail is worse than CPU.
        return (
            f"{gfx} is GCN5 (Vega): AMD ended ROCm support for it and GRETA's locked "
            "ROCm 7 builds do not target it (torch's ROCm 6.3/6.4 wheels still carry "
            "gfx900/gfx906 if you want to try one yourself)"
        )
    if fam == "RDNA1":
        return f"{gfx} is RDNA1, which no ROCm release supports"
    if fam is None:
        return f"{gfx} is not an architecture GRETA knows"
    return f"{gfx} ({fam}) has no GRETA target"


@dataclass(frozen=True)
class Override:
    value: str  # HSA_OVERRIDE_GFX_VERSION value
    warning: str | None = None


# The wheels carry gfx1030/gfx1100 but not their smaller siblings; the ISA is the same
# family, so the runtime can be told to load the sibling's code objects.
_OVERRIDES: dict[str, Override] = {
    **{
        g: Override("10.3.0")
        for g in ("gfx1031", "gfx1032", "gfx1033", "gfx1034", "gfx1035", "gfx1036")
    },
    "gfx1103": Override(
        "11.0.0",
        "gfx1103 (Radeon 760M/780M) runs gfx1100 code through HSA_OVERRIDE_GFX_VERSION=11.0.0: "
        "experimental, and reported to hang on some APUs",
    ),
}


# Radeon archs the ROCm 7 torch wheels do not carry and no override is known to fix.
_NOT_IN_WHEELS: frozenset[str] = frozenset({"gfx1152", "gfx1153"})


def wheel_gap_warning(gfx: str | None) -> str | None:
    """A warning for a radeon arch that the locked wheels lack and no override covers."""
    if (gfx or "") not in _NOT_IN_WHEELS:
        return None
    return (
        f"{gfx} is not in the gfx list of the ROCm 7 torch wheels (they carry gfx1150/gfx1151) "
        "and no HSA_OVERRIDE_GFX_VERSION is known to be safe for it: GPU code may fail with "
        "'invalid device function'"
    )


def hsa_override(gfx: str | None) -> Override | None:
    """The override an arch needs to run the locked wheels, if any."""
    return _OVERRIDES.get(gfx or "")


def override_to_gfx(value: str | None) -> str | None:
    """HSA_OVERRIDE_GFX_VERSION "10.3.0" -> "gfx1030"; None if malformed."""
    match = re.fullmatch(r"\s*(\d+)\.(\d+)\.(\d+)\s*", value or "")
    if not match:
        return None
    major, minor, step = (int(g) for g in match.groups())
    if minor > 15 or step > 15:
        return None
    return f"gfx{major}{minor:x}{step:x}"


# --- NVIDIA -------------------------------------------------------------------


def sm_from_compute_cap(cap: str | None) -> str | None:
    """ "9.0" -> "sm_90", "12.0" -> "sm_120"."""
    match = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", cap or "")
    if not match:
        return None
    return f"sm_{int(match.group(1))}{int(match.group(2))}"


# Order matters: the first pattern that matches wins ("RTX A6000" before "A6000"...).
_NVIDIA_NAMES: tuple[tuple[str, str], ...] = (
    (r"\bGB300\b|\bB300\b", "sm_103"),
    (r"\bGB[12]00\b|\bB[12]00\b", "sm_100"),
    (r"RTX PRO \d+ Blackwell|GeForce RTX 50[1-9]0", "sm_120"),
    (r"\bGH200\b|\bH100\b|\bH200\b|\bH800\b|\bH20\b", "sm_90"),
    (r"\bL40S?\b|\bL4\b|\bL20\b|GeForce RTX 40\d0|RTX \d{4} Ada|Ada Generation", "sm_89"),
    (r"Orin", "sm_87"),
    (r"\bA100\b|\bA800\b|\bA30\b", "sm_80"),
    (r"\bA10G?\b|\bA40\b|\bA16\b|\bA2\b|GeForce RTX 30\d0|RTX A\d{4}|\bA\d{4}\b", "sm_86"),
    (r"\bT4\b|GeForce RTX 20\d0|TITAN RTX|Quadro RTX|GTX 16\d0|\bT\d{3,4}\b", "sm_75"),
    (r"\bV100\b|TITAN V\b", "sm_70"),
    (r"\bP100\b", "sm_60"),
    (r"\bP40\b|\bP4\b|GTX 10\d0|TITAN Xp?\b", "sm_61"),
)
# Only architectures with a single compute capability can be mapped by name.
_NVIDIA_ARCHS: dict[str, str] = {
    "hopper": "sm_90",
    "ada lovelace": "sm_89",
    "turing": "sm_75",
    "volta": "sm_70",
}


def sm_from_name(name: str | None, architecture: str | None = None) -> str | None:
    """Compute capability from a product name ("NVIDIA H100 80GB HBM3" -> "sm_90")."""
    for pattern, sm in _NVIDIA_NAMES:
        if name and re.search(pattern, name, re.I):
            return sm
    return _NVIDIA_ARCHS.get((architecture or "").strip().lower())


def sm_number(sm: str | None) -> int | None:
    match = re.fullmatch(r"sm_(\d+)", sm or "")
    return int(match.group(1)) if match else None
