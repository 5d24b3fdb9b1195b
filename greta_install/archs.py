"""The one arch table: every GPU arch GRETA knows, and which torch build carries it.

One row per arch (`ARCHS`): family, wave size, lock target, override policy, known-bad
status with its evidence, tuned table name. One record per torch source (`TORCH_BUILDS`):
the archs its wheels carry code for, with the build-script line or release record it was
read from. matrix.toml names a row's build by id; detection, the plan (routing), the
doctor, the kernel-wheel build and the runtime (greta_core.arch) all read this module.

Sources: LLVM AMDGPUUsage processor table (gfx names, APUs, wave sizes), the build
records linked from each `TorchBuild`, NVIDIA's compute-capability table
(developer.nvidia.com/cuda-gpus). Pure data and functions; imports nothing heavy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import cast

from greta_install.errors import UnknownTorchBuildError
from greta_install.model import Target
from greta_install.triton_range import parse

# --- torch builds: which gfx/sm code each vendor build carries ---------------------------
# Every torch source a matrix row installs from is one `TorchBuild`; matrix.toml names it by
# id (`torch_build`), so the arch list of a row lives here, with the record it was read from.

PYTORCH_BUILD_SH = "https://github.com/pytorch/pytorch/blob/{branch}/.ci/docker/manywheel/build.sh"


@dataclass(frozen=True)
class TorchBuild:
    """One vendor's torch build and the GPU archs its wheels carry code for."""

    id: str  # the name matrix.toml uses (`torch_build`)
    label: str  # what it is, for people: "pytorch.org torch 2.14.1+rocm7.14"
    vendor: str  # "pytorch.org", "AMD TheRock", "default index"
    index: str | None  # the index the torch wheel comes from (None: the default index)
    archs: tuple[str, ...]  # archs whose code the wheels (with their device packages) carry
    evidence: tuple[str, ...]  # build-script lines / release records, by URL
    how: str  # one sentence: where the arch list was read

    def carries(self, arch: str | None) -> bool:
        return bool(arch) and arch in self.archs

    def runs(self, arch: str | None) -> bool:
        """Whether the wheels run a GPU of this arch with their own code (no override).

        AMD: only the gfx targets they carry. NVIDIA: any compute capability from the
        oldest one they carry up: a newer GPU runs a same-major cubin or the newest
        arch's PTX (sm_87 runs sm_86 code, sm_103 sm_100's).
        """
        if self.carries(arch):
            return True
        sm = sm_number(arch)
        oldest = min(filter(None, map(sm_number, self.archs)), default=None)
        return sm is not None and oldest is not None and sm >= oldest


# PYTORCH_ROCM_ARCH of the TheRock-based (ROCm 7.14) manywheel builds on pytorch's release
# branches: no gfx1103, no gfx1031-1036, no RDNA1 (pytorch/pytorch#179653, adding gfx1103,
# was closed unmerged; unslothai/unsloth#9829 read every release branch's build.sh).
_PYTORCH_ROCM714 = (
    "gfx908", "gfx90a", "gfx942", "gfx950", "gfx1030", "gfx1100", "gfx1101", "gfx1102",
    "gfx1150", "gfx1151", "gfx1200", "gfx1201",
)  # fmt: skip
# AMD's multi-arch index: one `amd-torch-device-gfxNNNN` package per target, all at the
# torch version (ROCm/pytorch#3518 lists the installed set for 2.12.0+rocm7.14.0).
_THEROCK_ROCM714 = (
    "gfx908", "gfx90a", "gfx942", "gfx950",
    "gfx1010", "gfx1011", "gfx1012",
    "gfx1030", "gfx1031", "gfx1032", "gfx1033", "gfx1034", "gfx1035", "gfx1036",
    "gfx1100", "gfx1101", "gfx1102", "gfx1103",
    "gfx1150", "gfx1151", "gfx1152", "gfx1153",
    "gfx1200", "gfx1201",
)  # fmt: skip
_NVIDIA_SMS = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120")

TORCH_BUILDS: dict[str, TorchBuild] = {
    b.id: b
    for b in (
        TorchBuild(
            "pytorch-rocm7.14",
            "pytorch.org torch 2.14.1+rocm7.14 (TheRock-based manywheel)",
            "pytorch.org",
            "https://download.pytorch.org/whl/rocm7.14",
            _PYTORCH_ROCM714,
            (
                PYTORCH_BUILD_SH.format(branch="release/2.14"),
                "https://github.com/unslothai/unsloth/pull/9829",
                "https://github.com/pytorch/pytorch/pull/179653",
            ),
            "PYTORCH_ROCM_ARCH in .ci/docker/manywheel/build.sh on release/2.14 (the 7.14 path "
            "uses the common list, without gfx1103, gfx1031-1036 or RDNA1)",
        ),
        TorchBuild(
            "pytorch-rocm7.2",
            "pytorch.org torch 2.11.0+rocm7.2 (classic wheels bundling ROCm)",
            "pytorch.org",
            "https://download.pytorch.org/whl/rocm7.2",
            ("gfx900", "gfx906", *_PYTORCH_ROCM714),
            (PYTORCH_BUILD_SH.format(branch="release/2.11"),),
            "PYTORCH_ROCM_ARCH in .ci/docker/manywheel/build.sh on release/2.11: the legacy "
            "(rocm/dev-almalinux) path prepends gfx900;gfx906 to the common list",
        ),
        TorchBuild(
            "therock-rocm7.14",
            "AMD TheRock torch 2.12.0+rocm7.14.0 with amd-torch-device-<gfx> packages",
            "AMD TheRock",
            "https://repo.amd.com/rocm/whl-multi-arch",
            _THEROCK_ROCM714,
            (
                "https://github.com/ROCm/pytorch/issues/3518",
                "https://github.com/bitsandbytes-foundation/bitsandbytes/pull/2046",
                "https://github.com/unslothai/unsloth/pull/9138",
                "https://github.com/ROCm/TheRock/blob/main/RELEASES.md",
            ),
            "the amd-torch-device-gfxNNNN==2.12.0+rocm7.14.0 packages of AMD's multi-arch index "
            "(an installed set listed in ROCm/pytorch#3518; gfx1103 and gfx1010-1012 checked "
            "against the index in bitsandbytes#2046; gfx1010 installed end to end in unsloth#9138)",
        ),
        TorchBuild(
            "pypi-cuda",
            "default-index torch (CUDA 13 build)",
            "default index",
            None,
            _NVIDIA_SMS,
            (
                "https://github.com/pytorch/pytorch/blob/main/.ci/manywheel/build_cuda.sh",
                "https://developer.nvidia.com/cuda-gpus",
            ),
            "TORCH_CUDA_ARCH_LIST of the CUDA 13 manywheel build (sm_75 ... sm_120; sm_89 runs "
            "the sm_86 cubins, same major version)",
        ),
        TorchBuild(
            "pytorch-cu130",
            "pytorch.org torch 2.11.0+cu130",
            "pytorch.org",
            "https://download.pytorch.org/whl/cu130",
            _NVIDIA_SMS,
            ("https://github.com/pytorch/pytorch/blob/release/2.11/.ci/manywheel/build_cuda.sh",),
            "TORCH_CUDA_ARCH_LIST of the CUDA 13.0 manywheel build on release/2.11",
        ),
        TorchBuild(
            "cpu",
            "CPU build (no GPU code)",
            "pytorch.org",
            "https://download.pytorch.org/whl/cpu",
            (),
            (),
            "a CPU build carries no GPU code",
        ),
    )
}


def torch_build(build_id: str) -> TorchBuild:
    """The build a matrix row names; UnknownTorchBuildError (a KeyError) otherwise."""
    try:
        return TORCH_BUILDS[build_id]
    except KeyError:
        raise UnknownTorchBuildError(
            f"unknown torch build {build_id!r} (greta_install/archs.py knows: "
            f"{', '.join(TORCH_BUILDS)})"
        ) from None


# --- the one table of per-arch facts -------------------------------------------------
# Detection, the install plan, the doctor, the kernel-wheel build and the runtime
# (greta_core.arch) all read these; tests/test_archfacts.py holds them together for every
# arch of the matrix.

_RDNA2_SIBLING = "runs gfx1030 code via HSA_OVERRIDE_GFX_VERSION=10.3.0 (unofficial, widely used)"


@dataclass(frozen=True)
class ArchFacts:
    """What GRETA knows about one GPU arch (AMD gfx or NVIDIA sm)."""

    gfx: str  # the arch name ("gfx1103", "sm_90"); kept as `gfx` for older callers
    # HSA_OVERRIDE_GFX_VERSION that runs a same-family sibling's code on this GPU, for
    # torch wheels that carry no code for it; None: no sibling is known to work.
    override: str | None = None
    # Whether GRETA may set that override by itself. Never on gfx1103/gfx115x: public
    # reports of page faults and whole-system hangs, and TheRock ships native builds.
    auto_override: bool = False
    warning: str | None = None  # shown whenever the override is in play
    family: str | None = None  # "RDNA3", "CDNA3", "Hopper"...
    wave: int | None = None  # default wavefront / warp size
    target: str | None = None  # the lock target (model.Target); None: GRETA has none
    integrated: bool = False  # an APU / iGPU sharing system memory
    # Known to install and then compute wrong results (or not run at all): refused by
    # default, with the evidence; `greta install --allow-known-bad-arch` proceeds anyway.
    known_bad: str | None = None
    known_bad_evidence: tuple[str, ...] = ()
    # Name of the tuned config table (greta_core/configs/tables/<name>.json) and of the
    # precompiled kernel set; None: the arch uses the default table.
    tuned_table: str | None = None
    matrix_unit: str | None = None  # "mfma" (CDNA), "wmma" (RDNA3+), "tensor" (NVIDIA)
    # The newest Triton (major, minor) whose compiler still targets the arch; None: every
    # Triton GRETA supports does.
    newest_triton: tuple[int, int] | None = None

    @property
    def arch(self) -> str:
        return self.gfx

    @property
    def runs_as(self) -> str | None:
        """The arch whose code runs under the override (its kernel-wheel arch)."""
        return override_to_gfx(self.override) if self.override else None

    def builds(self) -> tuple[TorchBuild, ...]:
        """Every torch build whose wheels carry this arch's code."""
        return tuple(b for b in TORCH_BUILDS.values() if b.carries(self.gfx))

    def carried_by(self, build_id: str) -> bool:
        return torch_build(build_id).carries(self.gfx)


def _amd(
    gfx: str,
    family: str,
    target: str | None,
    *,
    integrated: bool = False,
    override: str | None = None,
    auto_override: bool = False,
    warning: str | None = None,
    known_bad: str | None = None,
    evidence: tuple[str, ...] = (),
    tuned: bool = False,
) -> ArchFacts:
    wave = 32 if family.startswith("RDNA") else 64
    unit = (
        "mfma"
        if family.startswith("CDNA")
        else "wmma"
        if family[:5] in ("RDNA3", "RDNA4")
        else None
    )
    return ArchFacts(
        gfx, override, auto_override, warning, family, wave, target, integrated, known_bad,
        evidence, gfx if tuned else None, unit,
        # Triton 3.9's AMD backend refuses RDNA1/RDNA2 ("unsupported target: 'gfx1030'",
        # from the pass pipeline; triton==3.9.0 from the default index, checked for
        # gfx1010/1030/1036, and every gfx10 wheel build in the GPU suite on the locked
        # CUDA row). The AMD rows that carry these archs pin Triton 3.6-3.8.
        (3, 8) if family in ("RDNA1", "RDNA2") else None,
    )  # fmt: skip


def _nv(sm: str, family: str, tuned: bool = False) -> ArchFacts:
    return ArchFacts(sm, family=family, wave=32, target="cuda", tuned_table=sm if tuned else None,
                     matrix_unit="tensor")  # fmt: skip


_GFX906_BAD = (
    "gfx906 (MI50/MI60, Radeon VII) lost its kernels in the ROCm 6.4+ math libraries "
    "(rocBLAS/hipBLASLt/MIOpen): every ROCm 7 torch GRETA locks installs and then fails; "
    "the last build that still runs it is a ROCm 6.3 torch, which GRETA does not lock"
)
_GFX1033_BAD = (
    "gfx1033 (Steam Deck, Van Gogh APU) installs and then returns wrong numbers on every "
    "public ROCm torch tried: 60 SGD steps converge on the CPU (0.9710 -> 0.1148) and reach "
    "NaN on the GPU (-0.7765 -> nan); fp64 gradcheck fails while the forward matches"
)

ARCHS: dict[str, ArchFacts] = {
    f.gfx: f
    for f in (
        _amd("gfx900", "GCN5 (Vega)", None),
        _amd("gfx902", "GCN5 (Vega)", None, integrated=True),
        _amd("gfx904", "GCN5 (Vega)", None),
        _amd("gfx906", "GCN5 (Vega)", None, known_bad=_GFX906_BAD,
             evidence=("https://github.com/ROCm/TheRock/issues/1844",)),
        _amd("gfx909", "GCN5 (Vega)", None, integrated=True),
        _amd("gfx90c", "GCN5 (Vega)", None, integrated=True),
        _amd("gfx908", "CDNA1", "instinct"),
        _amd("gfx90a", "CDNA2", "instinct"),
        _amd("gfx940", "CDNA3", "mi300x"),
        _amd("gfx941", "CDNA3", "mi300x"),
        _amd("gfx942", "CDNA3", "mi300x", tuned=True),
        _amd("gfx950", "CDNA4", "instinct"),
        _amd("gfx1010", "RDNA1", "radeon"),
        _amd("gfx1011", "RDNA1", "radeon"),
        _amd("gfx1012", "RDNA1", "radeon"),
        _amd("gfx1013", "RDNA1", None, integrated=True),
        _amd("gfx1030", "RDNA2", "radeon"),
        _amd("gfx1031", "RDNA2", "radeon", override="10.3.0", auto_override=True,
             warning=f"gfx1031 (RX 6700/6750 XT) {_RDNA2_SIBLING}"),
        _amd("gfx1032", "RDNA2", "radeon", override="10.3.0", auto_override=True,
             warning=f"gfx1032 (RX 6600 class) {_RDNA2_SIBLING}"),
        _amd("gfx1033", "RDNA2", "radeon", integrated=True, override="10.3.0",
             auto_override=True, warning=f"gfx1033 (Van Gogh APU) {_RDNA2_SIBLING}",
             known_bad=_GFX1033_BAD,
             evidence=("https://github.com/unslothai/unsloth/issues/8412",)),
        _amd("gfx1034", "RDNA2", "radeon", override="10.3.0", auto_override=True,
             warning=f"gfx1034 (RX 6500/6400) {_RDNA2_SIBLING}"),
        _amd("gfx1035", "RDNA2", "radeon", integrated=True, override="10.3.0",
             auto_override=True, warning=f"gfx1035 (Radeon 660M/680M APU) {_RDNA2_SIBLING}"),
        _amd("gfx1036", "RDNA2", "radeon", integrated=True, override="10.3.0",
             auto_override=True,
             warning=f"gfx1036 (Raphael/Granite Ridge iGPU) {_RDNA2_SIBLING}"),
        _amd("gfx1037", "RDNA2", None, integrated=True),
        _amd("gfx1100", "RDNA3", "radeon", tuned=True),
        _amd("gfx1101", "RDNA3", "radeon"),
        _amd("gfx1102", "RDNA3", "radeon"),
        _amd("gfx1103", "RDNA3", "radeon", integrated=True, override="11.0.0",
             warning="gfx1103 (Radeon 740M/760M/780M) has no code in the classic ROCm torch "
             "wheels nor pytorch.org's ROCm 7.14 wheel; HSA_OVERRIDE_GFX_VERSION=11.0.0 is reported to cause page faults and "
             "system hangs, so GRETA never sets it: AMD's TheRock build carries native gfx1103 "
             "code"),
        _amd("gfx1150", "RDNA3.5", "radeon", integrated=True),
        _amd("gfx1151", "RDNA3.5", "radeon", integrated=True),
        _amd("gfx1152", "RDNA3.5", "radeon", integrated=True,
             warning="gfx1152 (Krackan Point) has no code in the classic ROCm torch wheels "
             "nor pytorch.org's ROCm 7.14 wheel, and no safe override: AMD's TheRock build carries native gfx1152 code"),
        _amd("gfx1153", "RDNA3.5", "radeon", integrated=True,
             warning="gfx1153 has no code in the classic ROCm torch wheels nor pytorch.org's "
             "ROCm 7.14 wheel, and no safe override: AMD's TheRock build carries native gfx1153 code"),
        _amd("gfx1200", "RDNA4", "radeon"),
        _amd("gfx1201", "RDNA4", "radeon", tuned=True),
        _nv("sm_75", "Turing"),
        _nv("sm_80", "Ampere"),
        _nv("sm_86", "Ampere"),
        _nv("sm_89", "Ada Lovelace"),
        _nv("sm_90", "Hopper", tuned=True),
        _nv("sm_100", "Blackwell"),
        _nv("sm_120", "Blackwell"),
    )
}  # fmt: skip

# Views kept for older callers: gfx -> family, the integrated set, gfx -> target.
FAMILY: dict[str, str] = {
    a: f.family for a, f in ARCHS.items() if a.startswith("gfx") and f.family is not None
}
INTEGRATED_GFX: frozenset[str] = frozenset(a for a, f in ARCHS.items() if f.integrated)
_TARGETS: dict[str, Target] = {
    a: cast(Target, f.target) for a, f in ARCHS.items() if a.startswith("gfx") and f.target
}
# Archs with a tuned config table and a precompiled kernel set (greta_core reads this).
TUNED_ARCHS: tuple[str, ...] = tuple(f.tuned_table for f in ARCHS.values() if f.tuned_table)

# MI300A is an APU too, but a datacenter one with 128 GB HBM: it is not the small
# iGPU that "prefer the discrete GPU" is about.
DATACENTER_APU_IDS: frozenset[str] = frozenset({"0x74a0"})
SRIOV_VF_IDS: frozenset[str] = frozenset({"0x74b5", "0x74b9"})

# XCDs per full device, to recognise a KFD node that is one compute partition.
XCC_PER_DEVICE: dict[str, int] = {"0x74a1": 8, "0x74a5": 8, "0x74a2": 4, "0x74a0": 6}


def family(gfx: str | None) -> str | None:
    return FAMILY.get(gfx or "")


def wave_size(gfx: str | None) -> int | None:
    """Default wavefront size: 64 on GCN/CDNA, 32 on RDNA."""
    return arch_facts(gfx).wave if gfx and gfx.startswith("gfx") else None


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
    bad = known_bad(gfx)
    if bad is not None and bad.target is None:
        return f"{bad.known_bad} ({', '.join(bad.known_bad_evidence)})"
    if fam == "GCN5 (Vega)":
        # ROCm 6.3 torch wheels still carry gfx900/gfx906, but the ROCm 6.4+ libraries
        # dropped their kernels (ROCm/TheRock#1844): a lock that installs and then fails
        # is worse than CPU.
        return (
            f"{gfx} is GCN5 (Vega): no ROCm 7 torch build GRETA locks runs it (the ROCm "
            "6.4+ libraries dropped GCN5 kernels, ROCm/TheRock#1844)"
        )
    if fam == "RDNA1":
        return f"{gfx} (RDNA1 APU) is carried by no torch build GRETA locks"
    if fam is None:
        return f"{gfx} is not an architecture GRETA knows"
    if target_for_gfx(gfx) is not None and not builds_running(gfx):
        return f"{gfx} ({fam}) is carried by no torch build GRETA locks"
    return f"{gfx} ({fam}) has no GRETA target"


@dataclass(frozen=True)
class Override:
    value: str  # HSA_OVERRIDE_GFX_VERSION value
    warning: str | None = None


def arch_facts(gfx: str | None) -> ArchFacts:
    """The facts of an arch (an empty record for an arch the table does not know)."""
    key = (gfx or "").split(":", 1)[0].strip().lower()
    return ARCHS.get(key, ArchFacts(key))


def known_bad(gfx: str | None) -> ArchFacts | None:
    """The arch's row when it is gated as known-bad, else None."""
    facts = arch_facts(gfx)
    return facts if facts.known_bad else None


def builds_carrying(gfx: str | None) -> tuple[TorchBuild, ...]:
    return arch_facts(gfx).builds()


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
    (r"\bP100\b|\bGP100", "sm_60"),
    (r"\bP40\b|\bP4\b|GTX 10\d0|TITAN Xp?\b|\bGP10[2-8]", "sm_61"),
    # Chip codes lspci names ("GM204 [GeForce GTX 970]", "GK208B [GeForce GT 710]"): older
    # cards no locked build runs, named so the reason a user reads carries their arch.
    (r"\bGM20[0-8]|GTX 9[5-8]0\b", "sm_52"),
    (r"\bGM10[78]|GTX 750\b", "sm_50"),
    (r"\bGK210", "sm_37"),
    (r"\bGK110|\bGK208", "sm_35"),
    (r"\bGK10[4-7]", "sm_30"),
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

# The oldest compute capability any NVIDIA torch build carries code for, read from
# TORCH_BUILDS (a test holds it to the cuda row's `archs` in lock/matrix.toml).
CUDA_MIN_SM: int = min(
    n for b in TORCH_BUILDS.values() for n in map(sm_number, b.archs) if n is not None
)


def builds_running(arch: str | None) -> tuple[TorchBuild, ...]:
    """Every torch build that runs this arch: its own code (`TorchBuild.runs`) or, for an
    AMD arch with a known sibling override, the sibling's."""
    facts = arch_facts(arch)
    if not facts.gfx:
        return ()
    sibling = facts.runs_as
    return tuple(
        b for b in TORCH_BUILDS.values() if b.runs(facts.gfx) or (sibling and b.carries(sibling))
    )


def triton_cannot_target(gfx: str | None, triton_version: str | None) -> str | None:
    """Why Triton `triton_version` cannot compile for `gfx`; None when it can."""
    facts = ARCHS.get(gfx or "")
    have = parse(triton_version)
    if facts is None or facts.newest_triton is None or have is None:
        return None
    if have <= facts.newest_triton:
        return None
    newest = ".".join(map(str, facts.newest_triton))
    return (
        f"Triton {triton_version} cannot compile for {gfx} ({facts.family}: its AMD backend "
        f"dropped the target after Triton {newest}); build with the Triton of a row that "
        f"carries {gfx} (the radeon rows pin Triton {newest} or older)"
    )


def locked_build_supports(vendor: str, arch: str | None, *, soc: bool = False) -> bool:
    """Whether some locked build runs this GPU: the one decision, read from TORCH_BUILDS.

    AMD also needs a GRETA target in the arch table: gfx900/gfx906 are still carried by
    the ROCm 7.2 wheels, but the math libraries in them lost their kernels (known bad).
    ``soc``: an NVIDIA GPU without a PCI bus (Jetson): aarch64, outside every lock.
    """
    if vendor == "nvidia":
        return not soc and sm_number(arch) is not None and bool(builds_running(arch))
    return target_for_gfx(arch) is not None and bool(builds_running(arch))


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
