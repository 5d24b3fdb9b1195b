"""Which row of a target installs a GPU arch: the first whose torch build carries it (pure).

A target's rows are tried in `matrix.ROW_NAMES` order (current, then AMD's TheRock build,
then the previous generation); the first whose torch build (greta_install/archs.py,
`TORCH_BUILDS`) lists the arch wins. An arch that no row's build carries is refused with
the closest option named: nothing is installed that cannot run a kernel on the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from greta_install import archs
from greta_install.errors import GretaError
from greta_install.locks.matrix import Matrix, Row


class RouteError(GretaError, ValueError):
    """No locked build carries the arch (or the arch belongs to no/another target)."""


@dataclass(frozen=True)
class Route:
    row: str  # the row name to install ("current", "therock", "previous")
    reason: str  # one sentence: why this row
    chosen: bool = True  # False: the user named the row (--row), routing only checked it


@dataclass(frozen=True)
class TorchSource:
    """What the plan says about the torch it installs for the arch."""

    row: str
    build: str  # id in archs.TORCH_BUILDS ("" where the row names none)
    label: str
    index: str | None
    arch: str | None
    carries_arch: bool | None  # None: no GPU arch in play (cpu)
    why: str
    evidence: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        return {
            "row": self.row,
            "build": self.build,
            "label": self.label,
            "index": self.index or "default",
            "arch": self.arch,
            "carries_arch": self.carries_arch,
            "why": self.why,
            "evidence": list(self.evidence),
        }


def _build_of(matrix: Matrix, target: str, row: str) -> archs.TorchBuild | None:
    build_id = matrix.row(target, matrix.pythons[-1], row).torch_build
    return archs.TORCH_BUILDS.get(build_id) if build_id else None


def _check_target(matrix: Matrix, target: str, arch: str) -> None:
    facts = archs.arch_facts(arch)
    spec = matrix.target(target)
    if not spec.archs or arch in spec.archs:
        return
    if facts.target is None:
        raise RouteError(
            f"no locked torch build runs {arch}: {archs.unsupported_reason(arch)}. Closest "
            "option: `greta install --target cpu` (the CPU row)"
        )
    raise RouteError(
        f"arch {arch} belongs to target {facts.target}, not {target}: pass --target {facts.target}"
    )


def route(
    matrix: Matrix,
    target: str,
    arch: str | None,
    requested: str | None = None,
    python: str | None = None,
) -> Route:
    """The row that installs `arch` on `target` (for `python`, when given); `requested` is
    the user's --row, if any."""
    gens = matrix.generations(target, python)
    if requested is not None and requested not in gens:
        on = f" on Python {python}" if python else ""
        raise RouteError(
            f"target {target} has no {requested!r} row{on} (it has: {', '.join(gens)})"
        )
    spec = matrix.target(target)
    if arch is None or not spec.kernel_wheel or not arch.startswith("gfx"):
        return Route(
            requested or "current", "no AMD arch to route: the target's row", requested is None
        )
    _check_target(matrix, target, arch)
    carriers = [g for g in gens if (b := _build_of(matrix, target, g)) and b.carries(arch)]
    if requested is not None:
        why = f"--row {requested} asked for"
        if requested not in carriers and carriers:
            why += f"; its torch build lacks {arch}, the {carriers[0]} row carries it natively"
        return Route(requested, why, chosen=False)
    if not carriers:
        facts = archs.arch_facts(arch)
        sibling_rows = [
            g for g in gens if (b := _build_of(matrix, target, g)) and b.carries(facts.runs_as)
        ]
        hint = (
            f"`--row {sibling_rows[0]}`, which runs it as {facts.runs_as} with "
            f"HSA_OVERRIDE_GFX_VERSION={facts.override} (unofficial, only when you ask), or "
            if sibling_rows
            else ""
        )
        raise RouteError(
            f"no locked torch build carries {arch} (rows: {', '.join(gens)}); nothing installed. "
            f"Closest option: {hint}`greta install --target cpu`"
        )
    row = carriers[0]
    build = _build_of(matrix, target, row)
    assert build is not None
    why = f"{build.label} carries {arch}"
    if row != "current":
        current = _build_of(matrix, target, "current")
        if current is not None:
            why += f"; the current row's {current.label} does not"
    return Route(row, why)


def torch_source(row: Row, arch: str | None, kernel_arch: str | None = None) -> TorchSource:
    """Which build the row's torch comes from and whether it carries the arch, with why."""
    build = archs.TORCH_BUILDS.get(row.torch_build) if row.torch_build else None
    torch = row.one("torch")
    index = torch.index if torch is not None else None
    if build is None:
        return TorchSource(row.generation, "", row.label, index, arch, None, "no torch build named")
    if arch is None or not build.archs:
        why = f"{build.label}: no GPU arch in play"
        return TorchSource(row.generation, build.id, build.label, index, arch, None, why)
    carries = build.carries(arch)
    if carries:
        why = f"{build.label} carries {arch}: {build.how}"
    elif kernel_arch and kernel_arch != arch:
        why = (
            f"{build.label} does not carry {arch}; the GPU runs {kernel_arch} code through "
            "HSA_OVERRIDE_GFX_VERSION (unofficial)"
        )
    else:
        why = f"{build.label} does not carry {arch}: expect 'invalid device function'"
    return TorchSource(
        row.generation, build.id, build.label, index, arch, carries, why, build.evidence
    )
