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


# --- the one table of per-arch facts -------------------------------------------------
# Detection, the install plan and the doctor all read these; a parametrised test holds
# them together for every arch of the matrix.


@dataclass(frozen=True)
class ArchFacts:
    """What GRETA knows about one AMD gfx arch beyond its family."""

    gfx: str
    # HSA_OVERRIDE_GFX_VERSION that runs a same-family sibling's code on this GPU, for
    # torch wheels that carry no code for it; None: no sibling is known to work.
    override: str | None = None
    # Whether GRETA may set that override by itself. Never on gfx1103/gfx115x: public
    # reports of page faults and whole-system hangs, and TheRock ships native gfx1103
    # and gfx1150-1153 builds instead.
    auto_override: bool = False
    warning: str | None = None  # shown whenever the override is in play

    @property
    def runs_as(self) -> str | None:
        """The arch whose code runs under the override (its kernel-wheel arch)."""
        return override_to_gfx(self.override) if self.override else None


_RDNA2_SIBLING = "runs gfx1030 code via HSA_OVERRIDE_GFX_VERSION=10.3.0 (unofficial, widely used)"
_ARCH_FACTS: dict[str, ArchFacts] = {
    f.gfx: f
    for f in (
        ArchFacts("gfx1031", "10.3.0", True, f"gfx1031 (RX 6700/6750 XT) {_RDNA2_SIBLING}"),
        ArchFacts("gfx1032", "10.3.0", True, f"gfx1032 (RX 6600 class) {_RDNA2_SIBLING}"),
        ArchFacts("gfx1033", "10.3.0", True, f"gfx1033 (Van Gogh APU) {_RDNA2_SIBLING}"),
        ArchFacts("gfx1034", "10.3.0", True, f"gfx1034 (RX 6500/6400) {_RDNA2_SIBLING}"),
        ArchFacts("gfx1035", "10.3.0", True, f"gfx1035 (Radeon 660M/680M APU) {_RDNA2_SIBLING}"),
        ArchFacts(
            "gfx1036", "10.3.0", True, f"gfx1036 (Raphael/Granite Ridge iGPU) {_RDNA2_SIBLING}"
        ),
        ArchFacts(
            "gfx1103",
            "11.0.0",
            False,
            "gfx1103 (Radeon 740M/760M/780M) has no code in the classic ROCm torch wheels; "
            "HSA_OVERRIDE_GFX_VERSION=11.0.0 is reported to cause page faults and system hangs, "
            "so GRETA never sets it: the ROCm 7.14 (TheRock) row carries native gfx1103 code",
        ),
        ArchFacts(
            "gfx1152",
            None,
            False,
            "gfx1152 (Krackan Point) has no code in the classic ROCm torch wheels and no safe "
            "override: the ROCm 7.14 (TheRock) row carries native gfx1152 code",
        ),
        ArchFacts(
            "gfx1153",
            None,
            False,
            "gfx1153 has no code in the classic ROCm torch wheels and no safe override: the "
            "ROCm 7.14 (TheRock) row carries native gfx1153 code",
        ),
    )
}


def arch_facts(gfx: str | None) -> ArchFacts:
    """The facts of an arch (an empty record for archs that need nothing special)."""
    key = (gfx or "").split(":", 1)[0].strip().lower()
    return _ARCH_FACTS.get(key, ArchFacts(key))


def known_override(gfx: str | None) -> str | None:
    """The sibling override known to run this arch, whether or not GRETA sets it itself."""
    return arch_facts(gfx).override


def experimental_override(gfx: str | None) -> str | None:
    """An override that exists but that GRETA never sets (the doctor warns about it)."""
    facts = arch_facts(gfx)
    return facts.override if facts.override and not facts.auto_override else None


@dataclass(frozen=True)
class OverrideDecision:
    """What to do about HSA_OVERRIDE_GFX_VERSION for one GPU and one set of torch wheels."""

    value: str | None  # the override to set; None: set none
    kernel_arch: str | None  # the arch whose code runs (kernel wheel arch)
    warnings: tuple[str, ...] = ()
    native: bool = False  # the wheels carry this arch's own code


def decide_override(
    gfx: str | None, wheel_archs: tuple[str, ...] | frozenset[str] | list[str]
) -> OverrideDecision:
    """Pure: the override a GPU of `gfx` needs to run torch wheels carrying `wheel_archs`.

    Native code always wins over an override. An override is set only where it is known
    and allowed (`auto_override`); otherwise the decision says why none is set.
    """
    if not gfx:
        return OverrideDecision(None, None)
    if gfx in wheel_archs or not gfx.startswith("gfx"):
        return OverrideDecision(None, gfx, native=True)
    facts = arch_facts(gfx)
    if facts.override and facts.auto_override and facts.runs_as in wheel_archs:
        return OverrideDecision(facts.override, facts.runs_as, tuple(filter(None, [facts.warning])))
    why = facts.warning or (
        f"the torch wheels have no {gfx} code and no override is known: "
        "expect 'HIP error: invalid device function'"
    )
    return OverrideDecision(None, gfx, (why,))


def hsa_override(gfx: str | None) -> Override | None:
    """The override GRETA sets for an arch on the classic (non-TheRock) ROCm wheels."""
    facts = arch_facts(gfx)
    if facts.override and facts.auto_override:
        return Override(facts.override, facts.warning)
    return None


def wheel_gap_warning(gfx: str | None) -> str | None:
    """A warning for an arch that the classic wheels lack and no automatic override covers."""
    facts = arch_facts(gfx)
    if facts.auto_override or not facts.warning:
        return None
    return facts.warning


def override_to_gfx(value: str | None) -> str | None:
    """HSA_OVERRIDE_GFX_VERSION "10.3.0" -> "gfx1030"; None if malformed."""
    match = re.fullmatch(r"\s*(\d{1,2})\.(\d{1,2})\.(\d{1,2})\s*", value or "")
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


# --- primary-GPU choice (issue 27) ----------------------------------------------------

# The oldest compute capability the cuda target's torch wheels carry code for (the
# `archs` of the cuda row in lock/matrix.toml; a test holds the two together).
CUDA_MIN_SM = 75


def locked_build_supports(vendor: str, arch: str | None, *, soc: bool = False) -> bool:
    """Whether some locked build can run this GPU (AMD: a GRETA target; NVIDIA: sm_75+).

    ``soc``: an NVIDIA GPU without a PCI bus (Jetson): aarch64, outside every lock.
    """
    if vendor == "nvidia":
        if soc:
            return False
        sm = sm_number(arch)
        return sm is not None and sm >= CUDA_MIN_SM
    return target_for_gfx(arch) is not None


def usability_rank(
    vendor: str,
    arch: str | None,
    *,
    usable: bool,
    integrated: bool,
    compute_units: int | None,
    memory_bytes: int | None,
    soc: bool = False,
) -> tuple[bool, bool, bool, int, int]:
    """Sort key of a GPU as a primary: higher runs more. Never vendor or enumeration order.

    Usable here, then runnable by a locked build, then a discrete GPU over an iGPU
    (that shares the CPU's memory bandwidth), then compute units, then memory.
    """
    return (
        usable,
        locked_build_supports(vendor, arch, soc=soc),
        not integrated,
        compute_units or 0,
        memory_bytes or 0,
    )
