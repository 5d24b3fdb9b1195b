"""The install plan: what `greta install` will do, decided from data alone (pure).

Inputs are the matrix (targets, arch rules), the lock of the chosen row, what detection
saw (optional: planning a cloud MI300X install from a laptop has none), and the few facts
the command gathered at the edge (installer available, kernel wheel found). The output is
an `InstallPlan`: the packages with their index and hash status, the kernel wheel for
the arch, the environment fixes, warnings, and the commands a real install runs.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from greta_install import archs, commandline, kernel_names
from greta_install.commandline import STAGE
from greta_install.errors import GretaError
from greta_install.locks import routing
from greta_install.locks.lockfile import Lock
from greta_install.locks.matrix import Matrix, Row, TargetSpec
from greta_install.model import Detection

if TYPE_CHECKING:
    from greta_install.install.hashrecord import HashRecord

PLAN_SCHEMA = 1
JIT_NOTE = "kernel wheel: not available, kernels compile on first use (JIT)"
BUILD_NOTE = (
    "no index or directory serves it: built on this machine after torch/triton are "
    "installed, with the installed Triton (cached, so a reinstall reuses it; "
    "--no-build-kernels skips it)"
)
# How each package's file is checked: against the lock's hash, against a hash recorded
# by an earlier install (trust on first use), or recorded now (first use).
HASH_VERIFIED, HASH_RECORDED, HASH_TOFU = "verified", "recorded", "trust-on-first-use"


class PlanError(GretaError, ValueError):
    """The request cannot be planned (unknown target, arch of another target...)."""


@dataclass(frozen=True)
class PlannedPackage:
    name: str
    version: str
    index: str | None  # None: the configured default index
    hashes: tuple[str, ...]
    role: str | None = None  # role in the matrix row (torch, triton, jax...), None if transitive
    recorded: tuple[str, ...] = ()  # hashes an earlier install recorded (trust on first use)
    sdist: bool = False  # a pure-Python source archive (the vendor publishes no wheel)

    @property
    def verified(self) -> bool:
        return bool(self.hashes)

    @property
    def hash_status(self) -> str:
        if self.hashes:
            return HASH_VERIFIED
        return HASH_RECORDED if self.recorded else HASH_TOFU

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "index": self.index or "default",
            "hash": self.hash_status,
            "hashes": list(self.hashes or self.recorded),
            "role": self.role,
            "sdist": self.sdist,
        }


@dataclass(frozen=True)
class KernelWheel:
    requirement: str | None  # "greta-kernels-gfx1100==0.1.0"; None on targets without one
    arch: str | None  # the arch whose wheel is used (after overrides)
    status: str  # "found" | "build" (built here after install) | "not-available" | "none"
    location: str | None  # file or index where it was found
    sha256: str | None  # from SHA256SUMS beside it, when present
    note: str
    pinned: str | None = None  # "sha256:<hex>" the lock pins for this wheel

    def to_json(self) -> dict[str, Any]:
        return {
            "requirement": self.requirement,
            "arch": self.arch,
            "status": self.status,
            "location": self.location,
            "sha256": self.sha256,
            "pinned": self.pinned,
            "note": self.note,
        }


@dataclass(frozen=True)
class KernelLookup:
    """What the edge found for the kernel wheel (filled by installer.find_kernel_wheel)."""

    source: str | None  # configured --kernel-wheels / GRETA_KERNEL_INDEX
    location: str | None = None
    sha256: str | None = None
    problem: str | None = None


@dataclass
class InstallPlan:
    target: str
    arch: str | None
    kernel_arch: str | None
    python_version: str
    python_executable: str | None
    installer: str
    lock_file: str
    platform: str
    packages: list[PlannedPackage]
    kernel_wheel: KernelWheel
    env: dict[str, str]
    env_why: dict[str, str]
    warnings: list[str]
    allow_unverified: bool  # kept for old scripts: trust on first use is the default now
    commands: dict[str, Any] = field(default_factory=dict)
    detected: bool = False
    strict: bool = False  # refuse every file without a lock hash or a given record
    row: str = "current"
    row_label: str = ""
    smoke: bool = True
    keep_failed: bool = False
    wheelhouse: str | None = None  # --save-wheelhouse DIR
    # The GPU is there but nothing here can use it (detection's "unusable" state):
    # each entry says why and what to type.
    device_blockers: list[str] = field(default_factory=list)
    torch_source: routing.TorchSource | None = None  # which build carries the arch, and why
    route_reason: str | None = None  # why routing chose this row (None: the user named it)
    gate: list[str] = field(default_factory=list)  # known-bad arch refusals (arch table)
    refusals: list[str] = field(default_factory=list)  # what the real run would refuse here

    @property
    def unverified(self) -> list[str]:
        """Packages without a lock hash (checked by trust on first use instead)."""
        return [p.name for p in self.packages if not p.verified]

    @property
    def first_use(self) -> list[str]:
        """Packages whose hash nobody has recorded yet: this install records it."""
        return [p.name for p in self.packages if p.hash_status == HASH_TOFU]

    @property
    def blockers(self) -> list[str]:
        unhashed = [
            f"{p.name}=={p.version}: no hash in the lock and none recorded (--strict); run "
            "`greta lock --fill-hashes` where the vendor index is reachable, or install with "
            "--from-record FILE from a machine that already trusted it"
            for p in self.packages
            if self.strict and p.hash_status == HASH_TOFU
        ]
        return [*self.device_blockers, *self.gate, *self.refusals, *unhashed]

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": PLAN_SCHEMA,
            "target": self.target,
            "arch": self.arch,
            "kernel_arch": self.kernel_arch,
            "detected": self.detected,
            "python": {"version": self.python_version, "executable": self.python_executable},
            "installer": self.installer,
            "lock": {"file": self.lock_file, "platform": self.platform},
            "row": {"name": self.row, "label": self.row_label, "why": self.route_reason},
            "torch_source": self.torch_source.to_json() if self.torch_source else None,
            "packages": [p.to_json() for p in self.packages],
            "unverified": self.unverified,
            "trust_on_first_use": self.first_use,
            "hash_policy": "strict" if self.strict else "trust-on-first-use",
            "vendor_downloads": [
                {"name": p.name, "version": p.version, "index": p.index, "hash": p.hash_status}
                for p in self.packages
                if p.index
            ],
            "kernel_wheel": self.kernel_wheel.to_json(),
            "env": dict(self.env),
            "env_why": dict(self.env_why),
            "warnings": list(self.warnings),
            "blockers": self.blockers,
            "ready": not self.blockers,
            "smoke_test": self.smoke,
            "commands": self.commands,
        }


def choose_target(explicit: str | None, detection: Detection | None, matrix: Matrix) -> str:
    target = explicit or (detection.target if detection else None)
    if target is None:
        raise PlanError("no target: detection is unavailable here, pass --target")
    if target not in matrix.targets:
        raise PlanError(f"unknown target {target!r}; choose one of: {', '.join(matrix.targets)}")
    return target


def choose_arch(
    target: str, spec: TargetSpec, explicit: str | None, detection: Detection | None
) -> tuple[str | None, list[str]]:
    warnings: list[str] = []
    arch = explicit
    if arch is None and detection is not None and detection.target == target:
        arch = detection.arch
    if arch is None:
        arch = spec.default_arch
        if arch and spec.kernel_wheel:
            warnings.append(
                f"arch not detected: planning for {target}'s default arch {arch} (pass --arch to change)"
            )
    if arch is not None:
        arch = arch.lower()
    if arch and not spec.kernel_wheel and explicit:
        raise PlanError(f"target {target} has no GPU arch; --arch {explicit} does not apply")
    if arch and spec.archs and arch not in spec.archs:
        raise PlanError(
            f"arch {arch} does not belong to target {target} (known: {', '.join(spec.archs)})"
        )
    return arch, warnings


def build_plan(
    matrix: Matrix,
    lock: Lock,
    *,
    detection: Detection | None = None,
    arch: str | None = None,
    python_executable: str | None = None,
    installer: str = "pip",
    download_argv: list[str] | None = None,
    kernel: KernelLookup | None = None,
    allow_unverified: bool = False,
    strict: bool = False,
    record: HashRecord | None = None,
    build_kernels: bool = True,
    smoke: bool = True,
    allow_known_bad: bool = False,
    route_reason: str | None = None,
) -> InstallPlan:
    spec = matrix.target(lock.target)
    row_name = lock.meta.get("row", "current")
    row = matrix.row(lock.target, lock.python, row_name)
    chosen_arch, warnings = choose_arch(lock.target, spec, arch, detection)
    env = dict(lock.env)
    env_why = {k: spec.env_why.get(k, "target default") for k in env}
    kernel_arch = chosen_arch

    if chosen_arch and spec.kernel_wheel and row.torch_archs and chosen_arch.startswith("gfx"):
        decision = archs.decide_override(chosen_arch, row.torch_archs)
        warnings.extend(decision.warnings)
        kernel_arch = decision.kernel_arch or chosen_arch
        if decision.value:
            env["HSA_OVERRIDE_GFX_VERSION"] = decision.value
            env_why["HSA_OVERRIDE_GFX_VERSION"] = (
                f"the {row_name} row's torch wheel carries no {chosen_arch} code; the GPU runs "
                f"{kernel_arch} code instead"
            )
            warnings.append(
                f"kernel wheel: using {kernel_names.distribution_name(kernel_arch)} because "
                f"HSA_OVERRIDE_GFX_VERSION={decision.value} makes the {chosen_arch} GPU run {kernel_arch} code"
            )
            warnings.extend(_restrict_visibility(detection, chosen_arch, env, env_why))
        elif not decision.native:
            native_rows = [
                g
                for g in matrix.generations(lock.target)
                if chosen_arch in matrix.row(lock.target, lock.python, g).torch_archs
            ]
            if native_rows:
                warnings.append(
                    f"the {native_rows[0]} row carries native {chosen_arch} code: "
                    f"use --row {native_rows[0]} (or leave --row out)"
                )

    gate: list[str] = []
    bad = archs.known_bad(chosen_arch) if spec.kernel_wheel else None
    if bad is not None:
        evidence = ", ".join(bad.known_bad_evidence)
        if allow_known_bad:
            warnings.append(f"{bad.known_bad} ({evidence}); proceeding: --allow-known-bad-arch")
        else:
            gate.append(
                f"{chosen_arch}: known bad: {bad.known_bad} ({evidence}). Refused by default; "
                "pass --allow-known-bad-arch to install anyway"
            )

    if detection is not None:
        for key, value in detection.env.items():
            if key == "HSA_OVERRIDE_GFX_VERSION":
                continue  # decided above, from the row's wheels (archs.decide_override)
            env[key] = value
            env_why.setdefault(key, "this machine needs it (greta detect)")
        for key, value in detection.env_seen.items():
            if key in env and env[key] != value:
                warnings.append(
                    f"{key}={value} is already set in your environment and wins over greta's {key}={env[key]}"
                )
        warnings.extend(w for w in detection.warnings if w not in warnings)

    roles = {p.name: p.role for p in row.pins}
    templates = [t for t in lock.meta.get("per-arch", "").split(",") if t]
    sdists = {t for t in lock.meta.get("sdist", "").split(",") if t}
    packages = [
        PlannedPackage(
            p.name,
            p.version,
            p.index,
            p.hashes,
            roles.get(p.name) or _template_role(p.name, templates, row),
            _recorded(record, p.name, p.version),
            p.name in sdists,
        )
        for p in lock.packages
        if _keep_for_arch(p.name, templates, kernel_arch)
    ]

    kernel_wheel = _plan_kernel_wheel(
        spec, lock, kernel_arch, kernel, allow_unverified or not strict, build_kernels
    )
    if kernel_wheel.status == "not-available":
        warnings.append(kernel_wheel.note)

    plan = InstallPlan(
        target=lock.target,
        arch=chosen_arch,
        kernel_arch=kernel_arch if spec.kernel_wheel else None,
        python_version=lock.python,
        python_executable=python_executable,
        installer=installer,
        lock_file=f"{lock.target}-py{lock.python.replace('.', '')}"
        + ("" if row_name == "current" else f"-{row_name}")
        + ".txt",
        platform=lock.meta.get("platform", matrix.platform),
        packages=packages,
        kernel_wheel=kernel_wheel,
        env=env,
        env_why=env_why,
        warnings=warnings,
        allow_unverified=allow_unverified,
        detected=detection is not None,
        device_blockers=(
            list(detection.blockers)
            if detection is not None
            and detection.state == "unusable"
            and detection.target == lock.target
            else []
        ),
        strict=strict,
        row=row_name,
        row_label=row.label,
        smoke=smoke,
        torch_source=routing.torch_source(row, chosen_arch, kernel_arch),
        route_reason=route_reason,
        gate=gate,
    )
    for pkg in packages:
        if pkg.hash_status == HASH_TOFU:
            plan.warnings.append(
                f"{pkg.name}=={pkg.version} from {pkg.index or 'the default index'} has no hash in "
                "the lock: its sha256 is shown and recorded at download (trust on first use)"
            )
    plan.commands = plan_commands(
        plan,
        download_argv
        or [*commandline.python_module(python_executable or "python", "pip"), "download"],
    )
    return plan


def _recorded(record: HashRecord | None, name: str, version: str) -> tuple[str, ...]:
    if record is None:
        return ()
    return tuple(
        sorted(
            {e.sha256 for e in record.entries.values() if e.name == name and e.version == version}
        )
    )


def _template_match(name: str, template: str) -> bool:
    head, _, tail = template.partition("{arch}")
    return name.startswith(head) and name.endswith(tail) and len(name) > len(head) + len(tail)


def _template_role(name: str, templates: list[str], row: Row) -> str | None:
    for pin in row.pins:
        if pin.per_arch and _template_match(name, pin.name):
            return pin.role
    return None


def _keep_for_arch(name: str, templates: list[str], arch: str | None) -> bool:
    """A per-arch package is kept only for the GPU's own arch."""
    for template in templates:
        if _template_match(name, template):
            return arch is not None and name == template.replace("{arch}", arch)
    return True


def _restrict_visibility(
    detection: Detection | None, arch: str, env: dict[str, str], env_why: dict[str, str]
) -> list[str]:
    """An override applies to every visible GPU: keep the others out of sight, or say so."""
    if detection is None:
        return []
    runtime = [
        g
        for g in detection.gpus
        if g.vendor == "amd" and ("kfd" in g.evidence or "rocminfo" in g.evidence)
    ]
    others = [g for g in runtime if g.arch != arch]
    if not others:
        return []
    names = ", ".join(sorted({g.arch or "unknown" for g in others}))
    chosen = [str(i) for i, g in enumerate(runtime) if g.arch == arch and g.usable]
    seen = {
        k: v
        for k, v in detection.env_seen.items()
        if k in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
    }
    if seen or not chosen:
        env.pop("HSA_OVERRIDE_GFX_VERSION", None)
        env_why.pop("HSA_OVERRIDE_GFX_VERSION", None)
        why = ", ".join(f"{k}={v}" for k, v in seen.items()) or "no usable GPU of that arch"
        return [
            f"HSA_OVERRIDE_GFX_VERSION not set: it would apply to the {names} GPU(s) too, and "
            f"greta cannot restrict visibility ({why})"
        ]
    env["ROCR_VISIBLE_DEVICES"] = ",".join(chosen)
    env_why["ROCR_VISIBLE_DEVICES"] = (
        f"HSA_OVERRIDE_GFX_VERSION applies to every visible GPU: only the {arch} GPU(s) stay visible"
    )
    return [
        f"the {names} GPU(s) are hidden (ROCR_VISIBLE_DEVICES={','.join(chosen)}): the override "
        f"that runs the {arch} would make them load the wrong code"
    ]


def _plan_kernel_wheel(
    spec: TargetSpec,
    lock: Lock,
    arch: str | None,
    kernel: KernelLookup | None,
    allow_unpinned: bool = True,
    build: bool = True,
) -> KernelWheel:
    """Where the kernel wheel comes from: a source that serves it, or a local build.

    A served wheel the lock pins no hash for is trusted on first use (its hash shown and
    recorded) unless --strict; a wheel nobody serves is built here after torch/triton.
    """
    if not spec.kernel_wheel or not lock.kernel_wheel or arch is None:
        return KernelWheel(
            None,
            None,
            "none",
            None,
            None,
            "this target uses no kernel wheel: Triton kernels run in Triton's interpreter "
            "(nothing to precompile for a CPU)",
        )
    version = lock.kernel_wheel.split("==", 1)[1] if "==" in lock.kernel_wheel else ""
    requirement = kernel_names.requirement(arch, version)
    pinned = lock.kernel_hashes.get(requirement)
    why = None
    if kernel is None or kernel.source is None:
        why = "no kernel wheel source configured (--kernel-wheels or GRETA_KERNEL_INDEX)"
    elif kernel.location is None:
        why = kernel.problem or f"{requirement} is not in {kernel.source}"
    elif pinned is None and not allow_unpinned:
        # SHA256SUMS comes from where the wheel comes from: it proves integrity, not origin.
        why = f"the lock pins no hash for {requirement} (--strict)"
    if why is not None:
        if build:
            return KernelWheel(
                requirement, arch, "build", None, None, f"{why}; {BUILD_NOTE}", pinned
            )
        return KernelWheel(
            requirement,
            arch,
            "not-available",
            None,
            None,
            f"{JIT_NOTE}: {why} (--no-build-kernels)",
            pinned,
        )
    assert kernel is not None
    how = (
        "sha256 pinned by the lock"
        if pinned
        else "no hash in the lock: trusted on first use"
        + ("; checked against SHA256SUMS" if kernel.sha256 else "; its sha256 is shown at staging")
    )
    return KernelWheel(requirement, arch, "found", kernel.location, kernel.sha256, how, pinned)


def plan_commands(plan: InstallPlan, download_argv: list[str]) -> dict[str, Any]:
    """The commands a real install runs, with <stage> for the staging directory.

    Built by the same functions the installer runs them from (greta_install.commandline).
    Every vendor download is listed, hashed or not: a dry run shows all network access.
    """
    stage = [commandline.download_argv(download_argv, pkg, STAGE) for pkg in plan.packages]
    if plan.kernel_wheel.status == "found" and plan.kernel_wheel.location:
        stage.append(["copy", plan.kernel_wheel.location, STAGE])
    install = commandline.install_argv(plan, STAGE)
    return {
        "stage": stage,
        "requirements": {pkg.name: commandline.requirement_line(pkg) for pkg in plan.packages},
        "verify": "sha256 of every staged file checked against the lock (or, for files the lock "
        "cannot hash, against the trust-on-first-use record) before anything is installed",
        "install": install,
        "env": "write greta-env.pth and greta-env.json into the environment's site-packages"
        if plan.env
        else None,
        "shell": [shlex.join(c) for c in [*stage, install]],
    }
