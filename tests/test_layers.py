"""The package's layering, read from the source (AST import graph): no import cycle between
modules, ``greta_core.kernels`` a leaf, the installer half free of greta_core and of the
heavy frameworks, ``greta_install``'s folders as layers whose imports only go down.
Imports inside functions count: a lazy import is still a dependency."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("greta", "greta_install", "greta_core")
HEAVY = ("torch", "jax", "jaxlib", "jax_triton", "triton", "numpy", "transformers")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            out[_module_name(path)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The project module `name` refers to (a package's __init__ for a package name)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the nodes under `if TYPE_CHECKING:`: a type checker reads them, Python never
    runs them, so they are no import edge (the standard way to name a type without a cycle)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        test = node.test if isinstance(node, ast.If) else None
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        ):
            for child in node.body:  # type: ignore[union-attr]
                skipped.update(id(n) for n in ast.walk(child))
    return skipped


def _imports(module: str, path: Path) -> set[str]:
    """Every name `module` imports at run time (absolute, relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_package = path.name == "__init__.py"
    names: set[str] = set()
    type_only = _type_checking_only(tree)
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            # `from pkg import mod` imports the submodule pkg.mod.
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


@functools.cache  # parsed once per session: every test reads the same tree
def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        targets = {_resolve(n) for n in _imports(module, path)}
        # A submodule importing its own package's __init__ (or vice versa) is Python's
        # package mechanics, not a layering edge.
        graph[module] = {
            t
            for t in targets
            if t
            and t != module
            and not module.startswith(t + ".")
            and not t.startswith(module + ".")
        }
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, or None (iterative DFS with colours)."""
    colour = dict.fromkeys(graph, 0)  # 0 new, 1 on the stack, 2 done
    for start in graph:
        if colour[start]:
            continue
        stack = [(start, iter(sorted(graph[start])))]
        path = [start]
        colour[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                colour[node] = 2
                stack.pop()
                path.pop()
            elif colour[child] == 1:
                return [*path[path.index(child) :], child]
            elif colour[child] == 0:
                colour[child] = 1
                stack.append((child, iter(sorted(graph[child]))))
                path.append(child)
    return None


def test_the_graph_sees_the_project() -> None:
    graph = _graph()
    assert "greta_core.ops.rms_norm" in graph
    assert "greta_core.kernels.rms_norm" in graph["greta_core.ops.rms_norm"]
    assert "greta_install.errors" in graph["greta_core.errors"]


def test_no_import_cycle() -> None:
    assert _cycle(_graph()) is None


def test_the_cycle_finder_finds_one() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


@pytest.mark.parametrize("upper", ["ops", "torch", "jax", "compute", "kernel_wheels", "bench"])
def test_kernels_import_nothing_above_them(upper: str) -> None:
    graph = _graph()
    offenders = {
        (m, t)
        for m, targets in graph.items()
        if m.startswith("greta_core.kernels")
        for t in targets
        if t.startswith(f"greta_core.{upper}")
    }
    assert not offenders


# Run as a script in a child interpreter (``python -c <its text>``): importing the frameworks
# there is its job, and a crash cannot take the doctor down.
# Programs the installer half starts in a child process of the target environment (python
# -m / a script path), never imported by it: they exist to run the frameworks there.
CHILD_SCRIPTS = (
    "greta_install.doctor.cluster_worker",
    "greta_install.doctor.probe",
    "greta_install.doctor.collective_worker",
    "greta_install.install.smoke_child",
)


def test_installer_half_imports_no_framework() -> None:
    offenders = [
        (module, name)
        for module, path in MODULES.items()
        if module.split(".")[0] in ("greta", "greta_install") and module not in CHILD_SCRIPTS
        for name in _imports(module, path)
        if name.split(".")[0] in HEAVY
    ]
    assert not offenders


def test_installer_reaches_greta_core_only_through_its_light_modules() -> None:
    # The doctor reads the kernel wheel and the backends summary (stdlib-only modules, imported
    # lazily); nothing else of the installer half touches greta_core.
    light = {"greta_core.kernel_wheels.installed", "greta_core.backends"}
    graph = _graph()
    offenders = {
        (m, t)
        for m, targets in graph.items()
        if m.split(".")[0] in ("greta", "greta_install") and m not in CHILD_SCRIPTS
        for t in targets
        if t.startswith("greta_core") and t not in light
    }
    assert not offenders


def test_ops_import_no_binding() -> None:
    graph = _graph()
    offenders = {
        (m, t)
        for m, targets in graph.items()
        if m.startswith("greta_core.ops")
        for t in targets
        if t.startswith(("greta_core.torch", "greta_core.jax", "greta_core.compute"))
    }
    assert not offenders


# greta_install's layers, in the order the data flows (docs/en/architecture.md). The
# top-level modules are the foundation every layer (and greta_core) may read: the error
# base, the arch table, the kernel-wheel names, the child command lines, bounded reads.
# Each folder may import the foundation, itself and the folders listed for it, nothing else.
INSTALL_LAYERS: dict[str, frozenset[str]] = {
    "detection": frozenset(),
    "environment": frozenset(),
    "locks": frozenset({"environment"}),
    "plan": frozenset({"environment", "locks"}),
    "install": frozenset({"detection", "environment", "locks", "plan"}),
    "doctor": frozenset({"detection", "environment", "locks"}),
    "commands": frozenset({"detection", "environment", "locks", "plan", "install", "doctor"}),
}
MAX_TOP_LEVEL_MODULES = 12
INSTALL = ROOT / "greta_install"


def _layer(module: str) -> str | None:
    """The greta_install folder `module` lives in; "" for a top-level module, None outside."""
    parts = module.split(".")
    if parts[0] != "greta_install":
        return None
    if len(parts) == 1 or (INSTALL / f"{parts[1]}.py").is_file():
        return ""
    return parts[1]


def _layer_offenders(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    offenders = set()
    for module, targets in graph.items():
        layer = _layer(module)
        if layer is None:
            continue
        for target in targets:
            to = _layer(target)
            if to is None or to == "":
                continue  # outside the installer (its own tests), or the foundation
            if layer == "":
                offenders.add((module, target))  # the foundation reads no layer
            elif to != layer and to not in INSTALL_LAYERS.get(layer, frozenset()):
                offenders.add((module, target))
    return offenders


def test_greta_install_top_level_holds_few_modules() -> None:
    modules = sorted(p.name for p in INSTALL.glob("*.py"))
    assert "errors.py" in modules
    assert len(modules) <= MAX_TOP_LEVEL_MODULES, modules


def test_every_greta_install_folder_is_a_known_layer() -> None:
    # A new folder must be placed in INSTALL_LAYERS (and the architecture page) on purpose.
    folders = {p.parent.name for p in INSTALL.glob("*/__init__.py")}
    assert folders == set(INSTALL_LAYERS)


def test_greta_install_imports_only_go_down() -> None:
    assert not _layer_offenders(_graph())


def test_the_layer_check_sees_an_upward_import() -> None:
    graph = {
        "greta_install.detection.snapshot": {"greta_install.doctor.multi_gpu_facts"},
        "greta_install.locks.matrix": {"greta_install.archs", "greta_install.environment.envfix"},
        "greta_install.archs": {"greta_install.detection.detect"},
        "greta_install.commands.install": {"greta_install.install.pipeline"},
    }
    assert _layer_offenders(graph) == {
        ("greta_install.detection.snapshot", "greta_install.doctor.multi_gpu_facts"),
        ("greta_install.archs", "greta_install.detection.detect"),
    }


def test_no_command_module_imports_another() -> None:
    # A command is a leaf of the CLI: what two commands share lives in a layer below them.
    graph = _graph()
    offenders = {
        (m, t)
        for m, targets in graph.items()
        for package in ("greta_install.commands.", "greta_core.commands.")
        if m.startswith(package)
        for t in targets
        if t.startswith(package)
    }
    assert not offenders


# greta_core reads the installer's foundation (errors, arch table, kernel-wheel names, child
# command lines); beyond it only these modules, each for a stated reason.
CORE_READS_OF_INSTALL_LAYERS = {
    # torch.distributed preflight runs the doctor's collective test in the job's ranks.
    "greta_core.distributed": "greta_install.doctor",
    # A kernel wheel's source hash, index and trust record (verify, record, recorded state)
    # are kept once, in the installer's kernel_build: `greta build-kernels` and `greta warm`
    # use them, and the precompiled cache reads the recorded state before serving a wheel.
    "greta_core.commands": "greta_install.install.kernel_build",
    "greta_core.kernel_wheels.precompiled": "greta_install.install.kernel_build",
}


def test_greta_core_reads_only_the_installer_foundation() -> None:
    graph = _graph()
    offenders = set()
    for module, targets in graph.items():
        if not module.startswith("greta_core"):
            continue
        for target in targets:
            if _layer(target) in (None, ""):
                continue
            allowed = [
                prefix
                for user, prefix in CORE_READS_OF_INSTALL_LAYERS.items()
                # `from greta_install.install import kernel_build` also runs the package's
                # __init__ (a docstring): the folder of an allowed module is allowed too.
                if module.startswith(user)
                and (target.startswith(prefix) or prefix.startswith(target + "."))
            ]
            if not allowed:
                offenders.add((module, target))
    assert not offenders


@pytest.mark.parametrize("lower", ["kernels", "ops", "kernel_wheels"])
def test_greta_core_lower_layers_reach_no_binding(lower: str) -> None:
    # kernels -> ops -> bindings (torch, jax, raw, compute) -> integrations and tools: the
    # kernel-wheel layer is read by the ops (the precompiled cache), so it calls no binding.
    graph = _graph()
    bindings = ("greta_core.torch", "greta_core.jax", "greta_core.raw", "greta_core.compute")
    offenders = {
        (m, t)
        for m, targets in graph.items()
        if m.startswith(f"greta_core.{lower}")
        for t in targets
        if t.startswith(bindings)
    }
    assert not offenders


def test_the_relayout_map_leads_from_gone_paths_to_real_modules() -> None:
    from _script_module import load_script

    relayout = load_script("scripts/relayout_paths.py")
    for old, new in relayout.MOVES.items():
        assert f"greta_install.{new}" in MODULES, new
        # `plan` is both: the old module's name is the new package's.
        assert old == "plan" or f"greta_install.{old}" not in MODULES, old
    text = (
        "from greta_install import archs, planning, lockfile as lf  # why\n"
        "x = greta_install.plan.build_plan(greta_install.smoke_child)\n"
        "see greta_install/parsers/lspci.py and greta_install/plan/noop.py\n"
    )
    assert relayout.rewrite(text) == (
        "from greta_install import archs  # why\n"
        "from greta_install.install import prepare as planning\n"
        "from greta_install.locks import lockfile as lf\n"
        "x = greta_install.plan.install_plan.build_plan(greta_install.install.smoke_child)\n"
        "see greta_install/detection/parsers/lspci.py and greta_install/plan/noop.py\n"
    )


# greta_core's packages by rank (issue 25's picture): foundation -> kernels -> ops (the
# declarations) -> bindings -> integrations -> tools. A package imports lower ranks and
# itself; the pairs below are the stated exceptions.
CORE_RANK = {
    "errors": 0,
    **dict.fromkeys(("arch", "observe", "reference", "compile", "graph"), 1),
    "configs": 2,
    "kernels": 3,
    "ops": 4,
    **dict.fromkeys(("raw", "torch", "jax"), 5),
    "compute": 6,  # GretaCompute dispatches to the torch binding
    **dict.fromkeys(("transformers", "distributed", "kernel_wheels", "backends"), 7),
    "hub": 8,  # HF kernels' layers are apply_greta's
    "bench": 8,
    **dict.fromkeys(("hub_repo", "commands"), 9),
}
CORE_EXCEPTIONS = {
    # The op's first call activates an installed kernel wheel's binaries (issue 25 item 3:
    # to move where the launch is built).
    ("greta_core.ops", "greta_core.kernel_wheels"),
}


def _core_offenders(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    offenders = set()
    for module, targets in graph.items():
        parts = module.split(".")
        if parts[0] != "greta_core" or len(parts) < 2:
            continue
        for target in targets:
            to = target.split(".")
            if to[0] != "greta_core" or len(to) < 2 or to[1] == parts[1]:
                continue
            pair = (f"greta_core.{parts[1]}", f"greta_core.{to[1]}")
            if CORE_RANK[to[1]] >= CORE_RANK[parts[1]] and pair not in CORE_EXCEPTIONS:
                offenders.add((module, target))
    return offenders


def test_every_greta_core_package_has_a_rank() -> None:
    packages = {m.split(".")[1] for m in MODULES if m.startswith("greta_core.")}
    assert packages == set(CORE_RANK)


def test_greta_core_imports_only_go_down() -> None:
    assert not _core_offenders(_graph())


def test_the_core_rank_check_sees_an_upward_import() -> None:
    graph = {
        "greta_core.ops.rms_norm": {"greta_core.kernels.rms_norm", "greta_core.torch.rms_norm"},
        "greta_core.ops.rope": {"greta_core.kernel_wheels.precompiled"},
        "greta_core.torch.rms_norm": {"greta_core.ops.rms_norm", "greta_core.jax.rms_norm"},
    }
    assert _core_offenders(graph) == {
        ("greta_core.ops.rms_norm", "greta_core.torch.rms_norm"),
        ("greta_core.torch.rms_norm", "greta_core.jax.rms_norm"),
    }
