"""The version matrix (lock/matrix.toml): load, validate, and select one row.

A row is one target on one Python version: the pins that must be installed together.
Validation enforces the facts a broken environment would otherwise teach the hard way
(jax/jaxlib/plugin/pjrt equal, one triton distribution, torch's local version matching
its index, Python limits of jax); every problem is reported at once with its place.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from greta_install import archs
from greta_install.errors import GretaError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

SCHEMA = 1
REQUIRED_TARGETS = ("mi300x", "radeon", "cuda", "cpu")
KNOWN_TARGETS = ("mi300x", "radeon", "instinct", "cuda", "cpu")
ROLES = (
    "torch",
    "triton",
    "jax",
    "jaxlib",
    "jax-plugin",
    "jax-pjrt",
    "jax-triton",
    "numpy",
    "extra",
)
# Distributions that install the `triton` import package: two in one env break it.
TRITON_DISTRIBUTIONS = ("triton", "triton-rocm", "pytorch-triton-rocm", "pytorch-triton")
_LOCAL_INDEX = re.compile(r"^(rocm\d+(?:\.\d+)*|cpu|cu\d+)$")
_ENV_KEY = re.compile(r"^[A-Z_][A-Z0-9_]*$")


class MatrixError(GretaError, ValueError):
    """matrix.toml is unreadable or violates a rule; the message lists every problem."""


@dataclass(frozen=True)
class Pin:
    name: str  # canonical distribution name
    version: str
    role: str
    pythons: tuple[str, ...]
    index: str | None = None  # None: the configured default index
    extras: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()  # only for vendor-index pins: their Requires-Dist
    provides: tuple[str, ...] = ()  # distribution names this pin stands in for
    source: str = ""
    uncertain: str | None = None
    # sha256 of the wheel per Python version ("3.12" -> ("sha256:...",)), attested by
    # public records where the vendor index publishes none; `hash_source` says which.
    hashes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    hash_source: str | None = None
    per_arch: bool = False  # name holds "{arch}": one distribution per GPU arch
    sdist: bool = False  # published only as a (pure-Python) source distribution

    def for_arch(self, arch: str) -> str:
        return canonicalize_name(self.name.replace("{arch}", arch))

    @property
    def requirement(self) -> str:
        extras = f"[{','.join(self.extras)}]" if self.extras else ""
        return f"{self.name}{extras}=={self.version}"


@dataclass(frozen=True)
class Generation:
    """Another stack a target keeps as a row: an older generation (`--row previous`), or
    another vendor's build that carries archs the current row's torch lacks (`therock`)."""

    label: str  # e.g. "torch 2.11 + ROCm 7.2"
    why: str  # who needs it
    torch_archs: tuple[str, ...]  # read from the arch table (archs.TORCH_BUILDS)
    pins: tuple[Pin, ...]
    torch_build: str = ""  # id of its torch build in greta_install/archs.py
    pythons: tuple[str, ...] = ()  # the Pythons the row covers; () means every matrix Python


# Row names in the order the plan prefers them for an arch (routing takes the first row
# whose torch build carries the arch).
ROW_NAMES = ("current", "therock", "previous")
ALTERNATE_ROWS = ROW_NAMES[1:]


@dataclass(frozen=True)
class TargetSpec:
    name: str
    hardware: str
    default_arch: str | None
    archs: tuple[str, ...]
    torch_archs: tuple[str, ...]
    kernel_wheel: bool
    env: Mapping[str, str]
    env_why: Mapping[str, str]
    system: str
    absent: Mapping[str, str]
    pins: tuple[Pin, ...]
    same_as: str | None = None
    label: str = ""  # what the current row is, e.g. "torch 2.14.1 + ROCm 7.14 (TheRock)"
    alternates: Mapping[str, Generation] = field(default_factory=dict)  # "previous", "therock"
    torch_build: str = ""  # id of the current row's torch build in greta_install/archs.py

    @property
    def previous(self) -> Generation | None:
        return self.alternates.get("previous")


@dataclass(frozen=True)
class Row:
    target: str
    python: str
    pins: tuple[Pin, ...]
    generation: str = "current"  # one of ROW_NAMES
    torch_archs: tuple[str, ...] = ()
    label: str = ""
    torch_build: str = ""  # id in archs.TORCH_BUILDS ("" where the matrix names none)

    def by_role(self, role: str) -> list[Pin]:
        return [p for p in self.pins if p.role == role]

    def one(self, role: str) -> Pin | None:
        found = self.by_role(role)
        return found[0] if len(found) == 1 else None


@dataclass(frozen=True)
class Matrix:
    exclude_newer: str
    platform: str
    pythons: tuple[str, ...]
    targets: Mapping[str, TargetSpec]
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def target(self, name: str) -> TargetSpec:
        try:
            return self.targets[name]
        except KeyError:
            raise MatrixError(
                f"unknown target {name!r}; the matrix has: {', '.join(self.targets)}"
            ) from None

    def owner(self, target: str) -> TargetSpec:
        """The spec that holds a target's pins (itself, or the one it is `same_as`)."""
        spec = self.target(target)
        return self.targets[spec.same_as] if spec.same_as else spec

    def generations(self, target: str, python: str | None = None) -> tuple[str, ...]:
        """The target's row names; with `python`, only the rows that cover that Python."""
        owner = self.owner(target)
        return tuple(
            g
            for g in ROW_NAMES
            if g == "current"
            or (
                g in owner.alternates
                and (
                    python is None
                    or not owner.alternates[g].pythons
                    or python in owner.alternates[g].pythons
                )
            )
        )

    def row(self, target: str, python: str, generation: str = "current") -> Row:
        self.target(target)
        if python not in self.pythons:
            raise MatrixError(
                f"no row for Python {python}: the matrix covers {', '.join(self.pythons)}"
            )
        owner = self.owner(target)
        if generation == "current":
            pins, torch_archs, label = owner.pins, owner.torch_archs, owner.label
            build = owner.torch_build
        elif generation in owner.alternates:
            alt = owner.alternates[generation]
            if alt.pythons and python not in alt.pythons:
                raise MatrixError(
                    f"target {target}'s {generation} row covers Python {', '.join(alt.pythons)}, "
                    f"not {python}"
                )
            pins, torch_archs, label, build = alt.pins, alt.torch_archs, alt.label, alt.torch_build
        else:
            raise MatrixError(
                f"target {target} has no {generation!r} row (it has: {', '.join(self.generations(target))})"
            )
        return Row(
            target,
            python,
            tuple(p for p in pins if python in p.pythons),
            generation,
            torch_archs,
            label,
            build,
        )

    def rows(self) -> list[Row]:
        return [
            self.row(t, py, g)
            for t in self.targets
            for g in self.generations(t)
            for py in self.pythons
            if g in self.generations(t, py)
        ]


def default_matrix_path() -> Path:
    from greta_install.locks.lockfile import lock_resource_dir

    return Path(str(lock_resource_dir() / "matrix.toml"))


def load_matrix(path: str | Path | None = None) -> Matrix:
    """Read and validate matrix.toml (the packaged one when no path is given)."""
    if path is None:
        from greta_install.locks.lockfile import lock_resource_dir

        resource = lock_resource_dir() / "matrix.toml"
        origin = "matrix.toml (packaged)"
        try:
            text = resource.read_text(encoding="utf-8")
        except OSError as exc:
            raise MatrixError(f"cannot read {origin}: {exc}") from None
    else:
        origin = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise MatrixError(f"cannot read {origin}: {exc}") from None
    return parse_matrix(text, origin)


def parse_matrix(text: str, origin: str = "matrix.toml") -> Matrix:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise MatrixError(f"{origin} is not valid TOML: {exc}") from None
    problems: list[str] = []
    matrix = _build(data, problems)
    if matrix is not None:
        problems.extend(validate(matrix))
    if problems:
        listed = "\n  - ".join(problems)
        raise MatrixError(f"{origin} is invalid:\n  - {listed}")
    assert matrix is not None
    return matrix


# --- building ---------------------------------------------------------------------------


def _str(
    table: Mapping[str, Any], key: str, where: str, problems: list[str], required: bool = True
) -> str | None:
    value = table.get(key)
    if value is None:
        if required:
            problems.append(f"{where}: missing `{key}`")
        return None
    if not isinstance(value, str) or not value.strip():
        problems.append(f"{where}: `{key}` must be a non-empty string, got {value!r}")
        return None
    return value


def _str_list(
    table: Mapping[str, Any], key: str, where: str, problems: list[str]
) -> tuple[str, ...]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        problems.append(f"{where}: `{key}` must be a list of strings, got {value!r}")
        return ()
    return tuple(value)


def _str_map(table: Mapping[str, Any], key: str, where: str, problems: list[str]) -> dict[str, str]:
    value = table.get(key, {})
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        problems.append(f"{where}: `{key}` must be a table of strings")
        return {}
    return dict(value)


def _build(data: Mapping[str, Any], problems: list[str]) -> Matrix | None:
    if data.get("schema") != SCHEMA:
        problems.append(f"`schema` must be {SCHEMA}, got {data.get('schema')!r}")
        return None
    lock = data.get("lock")
    if not isinstance(lock, dict):
        problems.append("missing [lock] table")
        return None
    exclude_newer = _str(lock, "exclude_newer", "[lock]", problems) or ""
    platform = _str(lock, "platform", "[lock]", problems) or ""
    pythons = _str_list(lock, "pythons", "[lock]", problems)
    if "archs" in data:
        problems.append(
            "[archs] is no longer read: arch facts (overrides, warnings) live in greta_install/archs.py"
        )
    targets: dict[str, TargetSpec] = {}
    raw_targets = data.get("targets")
    if not isinstance(raw_targets, dict):
        problems.append("missing [targets] table")
        return None
    for name, table in raw_targets.items():
        where = f"[targets.{name}]"
        if not isinstance(table, dict):
            problems.append(f"{where} must be a table")
            continue
        pins = _build_pins(table.get("pins", []), where, f" ([[targets.{name}.pins]])", problems)
        alternates = {}
        for alt in ALTERNATE_ROWS:
            raw_alt = table.get(alt)
            if raw_alt is not None:
                gen = _build_generation(raw_alt, f"{where}.{alt}", problems)
                if gen is not None:
                    alternates[alt] = gen
        if "torch_archs" in table:
            problems.append(
                f"{where}: `torch_archs` is no longer read: name the row's build with "
                "`torch_build` (its arch list lives in greta_install/archs.py)"
            )
        build = _str(table, "torch_build", where, problems, required=False) or ""
        kernel_wheel = table.get("kernel_wheel", False)
        if not isinstance(kernel_wheel, bool):
            problems.append(f"{where}: `kernel_wheel` must be true or false")
            kernel_wheel = False
        targets[name] = TargetSpec(
            name=name,
            hardware=_str(table, "hardware", where, problems) or "",
            default_arch=_str(table, "default_arch", where, problems, required=kernel_wheel),
            archs=_str_list(table, "archs", where, problems),
            torch_archs=_build_archs(build, where, problems),
            kernel_wheel=kernel_wheel,
            env=_str_map(table, "env", where, problems),
            env_why=_str_map(table, "env_why", where, problems),
            system=_str(table, "system", where, problems, required=False) or "",
            absent=_str_map(table, "absent", where, problems),
            pins=tuple(pins),
            same_as=_str(table, "same_as", where, problems, required=False),
            label=_str(table, "label", where, problems, required=False) or "",
            alternates=alternates,
            torch_build=build,
        )
    return Matrix(
        exclude_newer=exclude_newer,
        platform=platform,
        pythons=pythons,
        targets=targets,
        raw=dict(data),
    )


def _build_pins(raw_pins: Any, where: str, hint: str, problems: list[str]) -> list[Pin]:
    """A table's `pins` array, each checked (`hint` follows the not-an-array message)."""
    if not isinstance(raw_pins, list):
        problems.append(f"{where}: `pins` must be an array of tables{hint}")
        return []
    built = (_build_pin(raw, f"{where} pin #{i + 1}", problems) for i, raw in enumerate(raw_pins))
    return [pin for pin in built if pin is not None]


def _build_generation(raw: Any, where: str, problems: list[str]) -> Generation | None:
    if not isinstance(raw, dict):
        problems.append(f"[{where}] must be a table")
        return None
    pins = _build_pins(raw.get("pins", []), f"[{where}]", "", problems)
    if "torch_archs" in raw:
        problems.append(f"[{where}]: `torch_archs` is no longer read: use `torch_build`")
    build = _str(raw, "torch_build", where, problems, required=False) or ""
    return Generation(
        label=_str(raw, "label", where, problems) or "",
        why=_str(raw, "why", where, problems) or "",
        torch_archs=_build_archs(build, where, problems),
        pins=tuple(pins),
        torch_build=build,
        pythons=_str_list(raw, "pythons", where, problems),
    )


def _build_archs(build: str, where: str, problems: list[str]) -> tuple[str, ...]:
    """The arch list of a named torch build, from the arch table."""
    if not build:
        return ()
    try:
        return archs.torch_build(build).archs
    except KeyError as exc:
        problems.append(f"{where}: {exc.args[0]}")
        return ()


def _hashes(raw: Any, where: str, problems: list[str]) -> dict[str, tuple[str, ...]]:
    value = raw.get("hashes", {})
    if not isinstance(value, dict):
        problems.append(f"{where}: `hashes` must be a table of Python version -> list of sha256")
        return {}
    out = {}
    for py, items in value.items():
        if (
            not isinstance(items, list)
            or not all(
                isinstance(h, str) and re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in items
            )
            or not (py == "any" or re.fullmatch(r"3\.\d+", py))
        ):
            problems.append(
                f"{where}: hashes.{py} must be a list of 'sha256:<64 hex>' keyed by a Python "
                "version like 3.12 (or `any`)"
            )
            continue
        out[py] = tuple(items)
    if out and not raw.get("hash_source"):
        problems.append(f"{where}: `hashes` needs `hash_source` (where each hash was attested)")
    return out


def _build_pin(raw: Any, where: str, problems: list[str]) -> Pin | None:
    if not isinstance(raw, dict):
        problems.append(f"{where} must be a table")
        return None
    name = _str(raw, "name", where, problems)
    if name and (("{arch}" in name) != bool(raw.get("per_arch", False))):
        problems.append(f"{where}: a per_arch pin's name holds {{arch}}, and only such a pin's")
    version = _str(raw, "version", where, problems)
    role = _str(raw, "role", where, problems)
    source = _str(raw, "source", where, problems)
    if name is None or version is None or role is None:
        return None
    where = f"{where} ({name})"
    try:
        Version(version)
    except InvalidVersion:
        problems.append(f"{where}: `version` {version!r} is not a valid version")
    if role not in ROLES:
        problems.append(f"{where}: `role` {role!r} is not one of {', '.join(ROLES)}")
    for req in _str_list(raw, "requires", where, problems):
        try:
            Requirement(req)
        except InvalidRequirement as exc:
            problems.append(f"{where}: requirement {req!r} is invalid: {exc}")
    index = _str(raw, "index", where, problems, required=False)
    if index is not None and not index.startswith("https://"):
        problems.append(f"{where}: `index` must be an https:// URL, got {index!r}")
    return Pin(
        name=name.lower() if "{arch}" in name else canonicalize_name(name),
        version=version,
        role=role,
        pythons=_str_list(raw, "pythons", where, problems),
        index=index.rstrip("/") if index else None,
        extras=_str_list(raw, "extras", where, problems),
        requires=_str_list(raw, "requires", where, problems),
        provides=tuple(canonicalize_name(p) for p in _str_list(raw, "provides", where, problems)),
        source=source or "",
        uncertain=_str(raw, "uncertain", where, problems, required=False),
        hashes=_hashes(raw, where, problems),
        hash_source=_str(raw, "hash_source", where, problems, required=False),
        per_arch=bool(raw.get("per_arch", False)),
        sdist=bool(raw.get("sdist", False)),
    )


# --- rules ------------------------------------------------------------------------------


def validate(matrix: Matrix) -> list[str]:
    """Every rule violation of a built matrix, as readable sentences."""
    problems: list[str] = []
    for name in REQUIRED_TARGETS:
        if name not in matrix.targets:
            problems.append(f"target {name!r} is missing")
    for name, spec in matrix.targets.items():
        if name not in KNOWN_TARGETS:
            problems.append(f"target {name!r} is not one of {', '.join(KNOWN_TARGETS)}")
        if spec.same_as is not None:
            if spec.same_as not in matrix.targets or matrix.targets[spec.same_as].same_as:
                problems.append(
                    f"[targets.{name}]: same_as {spec.same_as!r} must name a target with its own pins"
                )
            if spec.pins or spec.alternates:
                problems.append(f"[targets.{name}]: a target with same_as has no pins of its own")
        for key in spec.env:
            if not _ENV_KEY.match(key):
                problems.append(
                    f"[targets.{name}.env]: {key!r} is not an environment variable name"
                )
        for arch in spec.archs:
            facts = archs.arch_facts(arch)
            if facts.family is None:
                problems.append(
                    f"[targets.{name}]: arch {arch} has no row in greta_install/archs.py"
                )
            elif facts.target != name:
                problems.append(
                    f"[targets.{name}]: arch {arch} belongs to target {facts.target} in "
                    "greta_install/archs.py"
                )
        alt_pins = [p for gen in spec.alternates.values() for p in gen.pins]
        for pin in (*spec.pins, *alt_pins):
            for py in pin.pythons:
                if py not in matrix.pythons:
                    problems.append(
                        f"[targets.{name}] {pin.name}: Python {py} is not in [lock] pythons"
                    )
            if pin.index is None and pin.requires:
                problems.append(
                    f"[targets.{name}] {pin.name}: `requires` is only for vendor-index pins "
                    "(default-index dependencies are resolved by `greta lock`)"
                )
    for python in matrix.pythons:
        if not re.match(r"^3\.\d+$", python):
            problems.append(f"[lock] pythons: {python!r} is not a Python version like 3.12")
    if problems:
        return problems
    for row in matrix.rows():
        problems.extend(validate_row(row, matrix.targets[row.target]))
    return problems


def validate_row(row: Row, spec: TargetSpec) -> list[str]:
    where = f"row {row.target}/py{row.python}" + (
        f" ({row.generation})" if row.generation != "current" else ""
    )
    problems: list[str] = []
    names = [p.name for p in row.pins]
    for dup in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"{where}: {dup} is pinned more than once")
    gpu = spec.kernel_wheel
    required = ["torch", "triton", "jax", "jaxlib", "numpy"] + (
        ["jax-plugin", "jax-pjrt"] if gpu else []
    )
    for role in required:
        count = len(row.by_role(role))
        if count != 1:
            problems.append(f"{where}: needs exactly one {role} pin, has {count}")
    if problems:
        return problems

    torch, triton, jax = row.one("torch"), row.one("triton"), row.one("jax")
    assert torch is not None and triton is not None and jax is not None
    problems.extend(_check_torch_index(torch, where))
    if triton.name not in TRITON_DISTRIBUTIONS:
        problems.append(f"{where}: triton pin {triton.name!r} is not a triton distribution")
    for pin in row.pins:
        if pin is not triton and (pin.name in TRITON_DISTRIBUTIONS or "triton" in pin.provides):
            problems.append(f"{where}: {pin.name} is a second distribution providing `triton`")

    jax_version = Version(jax.version)
    for role in ("jaxlib", "jax-plugin", "jax-pjrt"):
        pin = row.one(role)
        if pin is not None and Version(pin.version).release != jax_version.release:
            problems.append(
                f"{where}: {pin.name} {pin.version} must equal jax {jax.version} (jax, jaxlib, plugin and pjrt move together)"
            )
    if jax_version >= Version("0.11") and Version(row.python) < Version("3.12"):
        problems.append(f"{where}: jax {jax.version} needs Python >= 3.12")

    pinned = {p.name: p for p in row.pins}
    provided = {prov: p for p in row.pins for prov in p.provides}
    for pin in row.pins:
        for text in pin.requires:
            req = Requirement(text)
            name = canonicalize_name(req.name)
            target_pin = pinned.get(name) or provided.get(name)
            if target_pin is None:
                if name in TRITON_DISTRIBUTIONS:
                    problems.append(
                        f"{where}: {pin.name} requires {text} but the row pins {triton.name}"
                    )
                continue
            if not req.specifier.contains(Version(target_pin.version), prereleases=True):
                problems.append(
                    f"{where}: {pin.name} requires {text} but the row pins {target_pin.name}=={target_pin.version}"
                )
    jt = row.one("jax-triton")
    if (
        jt is not None
        and Version(jt.version) >= Version("0.4")
        and Version(triton.version) < Version("3.7")
    ):
        problems.append(
            f"{where}: jax-triton {jt.version} needs triton >= 3.7, the row pins {triton.version}"
        )
    return problems


def _check_torch_index(torch: Pin, where: str) -> list[str]:
    local = Version(torch.version).local
    if local is None:
        if torch.index is not None:
            return [
                f"{where}: torch {torch.version} has no local version but comes from {torch.index}"
            ]
        return []
    if not _LOCAL_INDEX.match(local):
        return [
            f"{where}: torch local version +{local} is not a known build (+rocmX.Y, +cuNNN, +cpu)"
        ]
    if local.startswith("rocm") and (torch.index or "").endswith("/whl-multi-arch"):
        return []  # AMD's multi-arch indexes serve every ROCm version's +rocmX.Y.Z builds
    if torch.index is None or not torch.index.endswith(f"/whl/{local}"):
        return [
            f"{where}: torch {torch.version} is a +{local} build and must come from a .../whl/{local} index, not {torch.index or 'the default index'}"
        ]
    return []
