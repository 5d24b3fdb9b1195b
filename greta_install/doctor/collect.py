"""Gather the facts the checks judge: every side effect of the doctor lives here.

Each source is optional: a failure becomes an `*_error` field or a None, never an exception.
"""

from __future__ import annotations

import contextlib
import grp
import importlib.metadata as metadata
import os
import pwd
import re
import stat
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from greta_install.detection.system_view import RELEVANT_ENV, SystemView
from greta_install.doctor.facts import (
    ContainerInfo,
    DeviceNode,
    Facts,
    InstalledDist,
    MemoryInfo,
    ProbeResult,
    PythonInfo,
    UserGroups,
)
from greta_install.doctor.index_query import query_index
from greta_install.doctor.multi_gpu_facts import collect_multi_gpu
from greta_install.doctor.probe_runner import probe_argv, run_probe

DEFAULT_PROBE_TIMEOUT_S = 120.0
DOCTOR_ENV = (
    *RELEVANT_ENV,
    "JAX_PLATFORMS",
    "CONDA_PREFIX",
    "VIRTUAL_ENV",
    "PYTHONDONTWRITEBYTECODE",
)
LOCK_PYTHONS = ("3.10", "3.11", "3.12", "3.13", "3.14")
_CGROUP_KINDS = (
    ("kubepods", "kubernetes"),
    ("libpod", "podman"),
    ("docker", "docker"),
    ("containerd", "containerd"),
    ("lxc", "lxc"),
)

ProbeCommand = Callable[[str], list[str]]


def _describe_error(exc: BaseException) -> str:
    if isinstance(exc, ImportError):
        return f"this build lacks {exc.name or 'a module'} ({exc})"
    return f"{type(exc).__name__}: {exc}"


def collect_detection(view: SystemView) -> tuple[Any, str | None]:
    try:
        from greta_install.detection.detect import detect

        return detect(view), None
    except Exception as exc:
        return None, _describe_error(exc)


def collect_container(view: SystemView, environ: Mapping[str, str] | None) -> ContainerInfo | None:
    evidence: list[str] = []
    kind: str | None = None
    if view.exists("/.dockerenv"):
        kind, evidence = "docker", [*evidence, "/.dockerenv"]
    if view.exists("/run/.containerenv"):
        kind, evidence = kind or "podman", [*evidence, "/run/.containerenv"]
    cgroup = view.read_text("/proc/1/cgroup")
    if cgroup:
        for needle, name in _CGROUP_KINDS:
            if needle in cgroup:
                kind, evidence = kind or name, [*evidence, f"/proc/1/cgroup mentions {needle}"]
                break
    if environ is not None:
        if environ.get("container"):
            kind = kind or environ["container"]
            evidence.append(f"container={environ['container']}")
        if environ.get("KUBERNETES_SERVICE_HOST"):
            kind = kind or "kubernetes"
            evidence.append("KUBERNETES_SERVICE_HOST is set")
    if kind is None and not view.is_live and cgroup is None:
        return None  # a snapshot that recorded no container markers: unknown, not "no"
    return ContainerInfo(kind, tuple(evidence))


def _node(path: str) -> DeviceNode:
    try:
        st = os.stat(path)
    except OSError:
        return DeviceNode(path, exists=False)
    try:
        group: str | None = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    return DeviceNode(
        path,
        exists=True,
        readable=os.access(path, os.R_OK),
        writable=os.access(path, os.W_OK),
        group=group,
        mode=stat.filemode(st.st_mode),
    )


def collect_device_nodes(view: SystemView) -> tuple[DeviceNode, ...] | None:
    render = [f"/dev/dri/{n}" for n in view.list_dir("/dev/dri") if n.startswith("renderD")]
    nvidia = [f"/dev/{n}" for n in view.list_dir("/dev") if n.startswith("nvidia")]
    paths = ["/dev/kfd", *render, *nvidia]
    if view.is_live:
        return tuple(_node(p) for p in paths)
    if not view.list_dir("/dev"):
        return None  # the snapshot holds no dev/ tree
    return tuple(DeviceNode(p, exists=view.exists(p)) for p in paths)


def collect_groups() -> UserGroups | None:
    try:
        entry = pwd.getpwuid(os.geteuid())
        user = entry.pw_name
        effective = {
            grp.getgrgid(g).gr_name for g in {*os.getgroups(), os.getegid()} if _has_gid(g)
        }
        configured = {g.gr_name for g in grp.getgrall() if user in g.gr_mem}
        if _has_gid(entry.pw_gid):
            configured.add(grp.getgrgid(entry.pw_gid).gr_name)
        return UserGroups(user, tuple(sorted(effective)), tuple(sorted(configured)))
    except (KeyError, OSError):
        return None


def _has_gid(gid: int) -> bool:
    try:
        grp.getgrgid(gid)
        return True
    except KeyError:
        return False


def _gpus_seen(facts: Facts) -> int:
    from greta_install.doctor.checks._common import detection_gpus, lspci_gpus

    return max(len(detection_gpus(facts)), len(lspci_gpus(facts.lspci)))


def collect_env_fixes() -> str:
    """State of this environment's persisted fixes (the start-up hook stays silent)."""
    from pathlib import Path

    from greta_install.environment import envfix

    site = Path(sysconfig.get_paths()["purelib"])
    try:
        return "absent" if envfix.read_env_fixes(site) is None else "ok"
    except envfix.EnvFixError as exc:
        return str(exc)


def collect_bytecode() -> dict[str, Any]:
    from greta_install.environment import bytecode

    found = {name: bytecode.package_state(name) for name in bytecode.FRAMEWORKS}
    return {name: state for name, state in found.items() if state is not None}


def collect_python() -> PythonInfo:
    stdlib = sysconfig.get_paths().get("stdlib", "")
    return PythonInfo(
        version=".".join(str(p) for p in sys.version_info[:3]),
        executable=sys.executable,
        prefix=sys.prefix,
        base_prefix=getattr(sys, "base_prefix", sys.prefix),
        conda_prefix=os.environ.get("CONDA_PREFIX"),
        externally_managed=bool(stdlib) and (Path(stdlib) / "EXTERNALLY-MANAGED").exists(),
        site_packages=sysconfig.get_paths().get("purelib", ""),
    )


def _provides_triton(dist: metadata.Distribution) -> bool:
    top = dist.read_text("top_level.txt")
    if top and "triton" in top.split():
        return True
    return any(str(f).startswith("triton/") for f in dist.files or ())


def collect_dists() -> tuple[InstalledDist, ...]:
    seen: dict[str, InstalledDist] = {}
    for dist in metadata.distributions():
        try:
            name = dist.metadata["Name"]
            if not name:
                continue
            key = canonicalize_name(name)
            if key in seen:  # the first on sys.path is the one imports see
                continue
            seen[key] = InstalledDist(
                key, str(dist.version), _provides_triton(dist), tuple(dist.requires or ())
            )
        except Exception:
            continue  # a broken .dist-info must not hide the others
    return tuple(sorted(seen.values(), key=lambda d: d.name))


def collect_lock(
    target: str, python: str, row: str = "current"
) -> tuple[Any, str | None, tuple[str, ...]]:
    try:
        from greta_install.locks.lockfile import load_lock
    except Exception as exc:
        return None, _describe_error(exc), ()
    lock, error = None, None
    try:
        lock = load_lock(target, python, row)
    except Exception as exc:
        error = str(exc) or type(exc).__name__
    available = []
    for candidate in LOCK_PYTHONS:
        with contextlib.suppress(Exception):
            load_lock(target, candidate)
            available.append(candidate)
    return lock, error, tuple(available)


def collect_memory(view: SystemView) -> MemoryInfo | None:
    """RAM and the TTM page limit: what an APU's GPU can borrow (live and snapshots)."""
    ram = None
    meminfo = view.read_text("/proc/meminfo") or ""
    match = re.search(r"^MemTotal:\s+(\d+)\s+kB", meminfo, re.M)
    if match:
        ram = int(match.group(1)) * 1024
    pages = None
    raw = (view.read_text("/sys/module/ttm/parameters/pages_limit") or "").strip()
    if raw.isdigit() and int(raw) > 0:
        pages = int(raw)
    if ram is None and pages is None:
        return None
    return MemoryInfo(ram_bytes=ram, ttm_pages_limit=pages)


def installed_row(target: str, python: str, dists: tuple[InstalledDist, ...] | None) -> Any:
    """The matrix row this environment holds: the one whose torch pin matches the installed
    torch; with no torch (or one GRETA did not install), the current row (what
    `greta install` would install). None when the matrix has no such target or Python."""
    from greta_install.locks.matrix import load_matrix

    matrix = load_matrix()
    if target not in matrix.targets or python not in matrix.pythons:
        return None
    installed = next((d.version for d in dists or () if d.name == "torch"), None)
    rows = [matrix.row(target, python, g) for g in matrix.generations(target, python)]
    for row in rows:
        pin = row.one("torch")
        if installed and pin is not None and pin.version == installed:
            return row
    return rows[0]


def collect_wheel_archs(
    target: str, python: str, dists: tuple[InstalledDist, ...] | None
) -> tuple[str, ...] | None:
    """gfx archs of the torch wheels of the matrix row this environment has installed."""
    row = installed_row(target, python, dists)
    return row.torch_archs if row is not None else None


def _probe_env(section: str) -> dict[str, str]:
    env = dict(os.environ)
    if section == "jax":
        # jax grabs 75% of GPU memory on first use by default; the probe needs none of it.
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    env.setdefault("PYTHONFAULTHANDLER", "1")
    return env


def collect_probes(
    sections: list[str], timeout_s: float, command: ProbeCommand
) -> dict[str, ProbeResult]:
    # Both probes at once: they are independent, and each may take seconds to import.
    # An empty working directory: `-c` puts the cwd first on sys.path, and a `torch/`
    # source checkout there would be imported instead of the installed torch.
    results = {}
    with tempfile.TemporaryDirectory(prefix="greta-doctor-") as cwd:
        with ThreadPoolExecutor(max_workers=max(1, len(sections))) as pool:
            futures = {
                s: pool.submit(run_probe, command(s), timeout_s, _probe_env(s), cwd)
                for s in sections
            }
        for section, future in futures.items():
            try:
                results[section] = future.result()
            except Exception as exc:
                results[section] = ProbeResult(
                    "crashed", error=f"could not run: {_describe_error(exc)}"
                )
    return results


def collect_facts(
    view: SystemView,
    *,
    target: str | None = None,
    check_index: bool = False,
    probe_timeout_s: float = DEFAULT_PROBE_TIMEOUT_S,
    probe_command: ProbeCommand | None = None,
    snapshot: str | None = None,
) -> Facts:
    live = bool(view.is_live)
    facts = Facts(live=live, snapshot=snapshot, check_index=check_index)
    facts.detection, facts.detection_error = collect_detection(view)
    facts.target = target or (facts.detection.target if facts.detection is not None else None)
    facts.target_source = "option" if target else ("detection" if facts.target else None)
    with contextlib.suppress(Exception):
        facts.lspci = view.run("lspci")
    with contextlib.suppress(Exception):
        facts.kfd_sysfs = view.exists("/sys/class/kfd")
    if live:
        facts.env = {k: os.environ[k] for k in DOCTOR_ENV if k in os.environ}
    else:
        with contextlib.suppress(Exception):
            facts.env = dict(view.env())
        facts.env_known = view.exists("/env.json")
    with contextlib.suppress(Exception):
        facts.container = collect_container(view, os.environ if live else None)
    with contextlib.suppress(Exception):
        facts.device_nodes = collect_device_nodes(view)
    with contextlib.suppress(Exception):
        facts.multi_gpu = collect_multi_gpu(view, _gpus_seen(facts))
    with contextlib.suppress(Exception):
        facts.memory = collect_memory(view)
    if not live:
        if facts.target:
            # A snapshot has no environment: judge it against the row greta would install.
            with contextlib.suppress(Exception):
                facts.wheel_archs = collect_wheel_archs(facts.target, "3.12", None)
        return facts
    facts.groups = collect_groups()
    facts.python = collect_python()
    with contextlib.suppress(Exception):
        facts.env_fixes = collect_env_fixes()
    with contextlib.suppress(Exception):
        facts.dists = collect_dists()
    with contextlib.suppress(Exception):
        facts.bytecode = collect_bytecode()
    if facts.target:
        row = "current"
        with contextlib.suppress(Exception):
            found = installed_row(facts.target, facts.python.minor, facts.dists)
            row = found.generation if found is not None else "current"
        # An environment installed with `--row previous` is checked against that row's lock.
        facts.lock, facts.lock_error, facts.lock_pythons = collect_lock(
            facts.target, facts.python.minor, row
        )
        with contextlib.suppress(Exception):
            facts.wheel_archs = collect_wheel_archs(facts.target, facts.python.minor, facts.dists)
    if facts.target == "cuda":
        with contextlib.suppress(Exception):
            from greta_install.environment import ptxas

            facts.ptxas = ptxas.collect(ptxas.this_site_dirs())
    sections = ["torch"]
    if facts.dists is None or any(d.name == "jax" for d in facts.dists):
        sections.append("jax")
    probes = collect_probes(sections, probe_timeout_s, probe_command or probe_argv)
    facts.torch_probe = probes.get("torch")
    facts.jax_probe = probes.get("jax", ProbeResult("not_run"))
    torch_ok = facts.torch_probe is not None and facts.torch_probe.outcome == "ok"
    if torch_ok and probe_command is None:
        # The NVIDIA -> AMD library mapping; it runs its own subprocess with a timeout.
        with contextlib.suppress(Exception):
            from greta_core.backends import doctor_summary

            facts.backends = doctor_summary(timeout=probe_timeout_s)
    if check_index and facts.lock is not None:
        with contextlib.suppress(Exception):
            facts.index_status = query_index(
                list(facts.lock.packages) if facts.lock is not None else []
            )
    return facts
