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
from typing import Any

from greta_install import kernel_names
from greta_install.errors import GretaError
from greta_install.lockfile import Lock
from greta_install.matrix import Matrix, TargetSpec
from greta_install.model import Detection

PLAN_SCHEMA = 1
STAGE = "<stage>"  # placeholder for the temporary staging directory in shown commands
JIT_NOTE = "kernel wheel: not available, kernels compile on first use (JIT)"


class PlanError(GretaError, ValueError):
    """The request cannot be planned (unknown target, arch of another target...)."""


@dataclass(frozen=True)
class PlannedPackage:
    name: str
    version: str
    index: str | None  # None: the configured default index
    hashes: tuple[str, ...]
    role: str | None = None  # role in the matrix row (torch, triton, jax...), None if transitive

    @property
    def verified(self) -> bool:
        return bool(self.hashes)

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "index": self.index or "default",
            "hash": "verified" if self.verified else "unverified",
            "hashes": list(self.hashes),
            "role": self.role,
        }


@dataclass(frozen=True)
class KernelWheel:
    requirement: str | None  # "greta-kernels-gfx1100==0.1.0"; None on targets without one
    arch: str | None  # the arch whose wheel is used (after overrides)
    status: str  # "found" | "not-available" | "none"
    location: str | None  # file or index where it was found
    sha256: str | None  # from SHA256SUMS beside it, when present
    note: str

    def to_json(self) -> dict[str, Any]:
        return {
            "requirement": self.requirement,
            "arch": self.arch,
            "status": self.status,
            "location": self.location,
            "sha256": self.sha256,
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
    allow_unverified: bool
    commands: dict[str, Any] = field(default_factory=dict)
    detected: bool = False

    @property
    def unverified(self) -> list[str]:
        return [p.name for p in self.packages if not p.verified]

    @property
    def blockers(self) -> list[str]:
        if self.unverified and not self.allow_unverified:
            return [
                f"{name}: no hash in the lock (unverified); pass --allow-unverified to install it "
                "and check the hash greta shows against the vendor's"
                for name in self.unverified
            ]
        return []

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
            "packages": [p.to_json() for p in self.packages],
            "unverified": self.unverified,
            "allow_unverified": self.allow_unverified,
            "kernel_wheel": self.kernel_wheel.to_json(),
            "env": dict(self.env),
            "env_why": dict(self.env_why),
            "warnings": list(self.warnings),
            "blockers": self.blockers,
            "ready": not self.blockers,
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
) -> InstallPlan:
    spec = matrix.target(lock.target)
    chosen_arch, warnings = choose_arch(lock.target, spec, arch, detection)
    env = dict(lock.env)
    env_why = {k: spec.env_why.get(k, "target default") for k in env}
    kernel_arch = chosen_arch

    if (
        chosen_arch
        and spec.kernel_wheel
        and spec.torch_archs
        and chosen_arch not in spec.torch_archs
    ):
        rule = matrix.archs.get(chosen_arch)
        if rule is not None and rule.override:
            env["HSA_OVERRIDE_GFX_VERSION"] = rule.override
            env_why["HSA_OVERRIDE_GFX_VERSION"] = (
                f"the torch wheel carries no {chosen_arch} code; the GPU runs {rule.kernel_arch} code instead"
            )
            kernel_arch = rule.kernel_arch
            warnings.append(
                rule.warning or f"{chosen_arch} runs as {rule.kernel_arch} (unofficial)"
            )
            warnings.append(
                f"kernel wheel: using {kernel_names.distribution_name(rule.kernel_arch)} because "
                f"HSA_OVERRIDE_GFX_VERSION={rule.override} makes the {chosen_arch} GPU run {rule.kernel_arch} code"
            )
        else:
            warnings.append(
                f"the torch wheel of {lock.target} has no {chosen_arch} code and no override is known: "
                "expect 'HIP error: invalid device function'"
            )

    if detection is not None:
        for key, value in detection.env.items():
            env[key] = value
            env_why.setdefault(key, "this machine needs it (greta detect)")
        for key, value in detection.env_seen.items():
            if key in env and env[key] != value:
                warnings.append(
                    f"{key}={value} is already set in your environment and wins over greta's {key}={env[key]}"
                )
        warnings.extend(detection.warnings)

    roles = {p.name: p.role for p in matrix.row(lock.target, lock.python).pins}
    packages = [
        PlannedPackage(p.name, p.version, p.index, p.hashes, roles.get(p.name))
        for p in lock.packages
    ]

    kernel_wheel = _plan_kernel_wheel(spec, lock, kernel_arch, kernel)
    if kernel_wheel.status == "not-available":
        warnings.append(kernel_wheel.note)

    plan = InstallPlan(
        target=lock.target,
        arch=chosen_arch,
        kernel_arch=kernel_arch if spec.kernel_wheel else None,
        python_version=lock.python,
        python_executable=python_executable,
        installer=installer,
        lock_file=f"{lock.target}-py{lock.python.replace('.', '')}.txt",
        platform=lock.meta.get("platform", matrix.platform),
        packages=packages,
        kernel_wheel=kernel_wheel,
        env=env,
        env_why=env_why,
        warnings=warnings,
        allow_unverified=allow_unverified,
        detected=detection is not None,
    )
    for name in plan.unverified:
        pkg = next(p for p in packages if p.name == name)
        plan.warnings.append(
            f"{name}=={pkg.version} from {pkg.index or 'the default index'} is unverified: its hash could not "
            "be obtained where the lock was made"
        )
    plan.commands = plan_commands(
        plan, download_argv or [python_executable or "python", "-m", "pip", "download"]
    )
    return plan


def _plan_kernel_wheel(
    spec: TargetSpec, lock: Lock, arch: str | None, kernel: KernelLookup | None
) -> KernelWheel:
    if not spec.kernel_wheel or not lock.kernel_wheel or arch is None:
        return KernelWheel(None, None, "none", None, None, "this target uses no kernel wheel")
    version = lock.kernel_wheel.split("==", 1)[1] if "==" in lock.kernel_wheel else ""
    requirement = kernel_names.requirement(arch, version)
    if kernel is None or kernel.source is None:
        return KernelWheel(
            requirement,
            arch,
            "not-available",
            None,
            None,
            f"{JIT_NOTE}: no kernel wheel source configured (--kernel-wheels or GRETA_KERNEL_INDEX)",
        )
    if kernel.location is None:
        why = kernel.problem or f"{requirement} is not in {kernel.source}"
        return KernelWheel(requirement, arch, "not-available", None, None, f"{JIT_NOTE}: {why}")
    how = (
        "sha256 from SHA256SUMS"
        if kernel.sha256
        else "no SHA256SUMS: its sha256 is computed and shown at staging"
    )
    return KernelWheel(requirement, arch, "found", kernel.location, kernel.sha256, how)


def plan_commands(plan: InstallPlan, download_argv: list[str]) -> dict[str, Any]:
    """The commands a real install runs, with <stage> for the staging directory."""
    stage = []
    for pkg in plan.packages:
        if not pkg.verified and not plan.allow_unverified:
            continue
        argv = [*download_argv, "--no-deps", "--only-binary=:all:", "--dest", STAGE]
        if pkg.index:
            argv += ["--extra-index-url", pkg.index]
        argv.append(pkg.requirement)
        stage.append(argv)
    if plan.kernel_wheel.status == "found" and plan.kernel_wheel.location:
        stage.append(["copy", plan.kernel_wheel.location, STAGE])
    py = plan.python_executable or "python"
    common = [
        "--no-index",
        "--find-links",
        STAGE,
        "--no-deps",
        "--require-hashes",
        "-r",
        f"{STAGE}/requirements.txt",
    ]
    if plan.installer == "uv":
        install = ["uv", "pip", "install", "--python", py, *common]
    else:
        install = [py, "-m", "pip", "install", *common]
    return {
        "stage": stage,
        "verify": "sha256 of every staged file checked against the lock before anything is installed",
        "install": install,
        "env": "write greta-env.pth and greta-env.json into the environment's site-packages"
        if plan.env
        else None,
        "shell": [shlex.join(c) for c in [*stage, install]],
    }
