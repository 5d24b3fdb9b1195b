"""JAX, from installed metadata and the jax probe subprocess.

Failure mode 11: jax, jaxlib, the GPU plugin and pjrt must all be the same version, and the
plugin must load.
"""

from __future__ import annotations

import re
from typing import Any

from packaging.version import InvalidVersion, Version

from greta_install.doctor.facts import Facts, InstalledDist
from greta_install.doctor.model import Finding, fail, ok, skip, warn

from ._common import (
    AMD_TARGETS,
    GPU_TARGETS,
    SNAPSHOT_SKIP,
    dict_list,
    first_line,
    install_fix,
    lock_packages,
    lock_pin,
    pip_install_line,
    probe_failure,
    section_of,
    str_list,
)

_PLUGIN = re.compile(r"^jax-(rocm\d+|cuda\d+)-(plugin|pjrt)$")


def jax_family(facts: Facts) -> list[InstalledDist]:
    """jax, jaxlib and every installed GPU plugin/pjrt distribution."""
    return [d for d in facts.dists or () if d.name in ("jax", "jaxlib") or _PLUGIN.match(d.name)]


def _plugins(facts: Facts, kind: str | None = None) -> list[InstalledDist]:
    found = []
    for d in facts.dists or ():
        match = _PLUGIN.match(d.name)
        if match and (kind is None or match.group(1).startswith(kind)):
            found.append(d)
    return found


def _release(version: str) -> tuple[int, ...] | None:
    try:
        return Version(version).release
    except InvalidVersion:
        return None


def _wanted_version(facts: Facts, jax: InstalledDist) -> str:
    pin = lock_pin(facts, "jax")
    return str(pin.version) if pin is not None and pin.version else jax.version


def _plugin_line(facts: Facts, version: str, names: list[str]) -> str:
    indexes = [p.index if (p := lock_pin(facts, n)) is not None else None for n in names]
    return pip_install_line([(n, version) for n in names], indexes)


def check_versions(facts: Facts) -> Finding:
    if not facts.live:
        return skip(SNAPSHOT_SKIP)
    if facts.dists is None:
        return skip("installed distributions were not listed")
    jax = facts.dist("jax")
    if jax is None:
        return skip("jax is not installed")
    family = jax_family(facts)
    versions = {d.name: d.version for d in family}
    wanted = _wanted_version(facts, jax)
    if "jaxlib" not in versions:
        return fail(
            f"jax {jax.version} is installed without jaxlib", pip_install_line([("jaxlib", wanted)])
        )
    releases = {_release(v) for v in versions.values()}
    if len(releases) > 1:
        listed = ", ".join(f"{n} {v}" for n, v in versions.items())
        return fail(
            f"jax, jaxlib and the plugins must be one version; installed: {listed}",
            _plugin_line(facts, wanted, list(versions)),
            versions=versions,
        )
    rocm, cuda = _plugins(facts, "rocm"), _plugins(facts, "cuda")
    if rocm and cuda:
        drop = cuda if facts.target in AMD_TARGETS else rocm
        return warn(
            "both ROCm and CUDA jax plugins are installed: "
            + ", ".join(d.name for d in rocm + cuda),
            "pip uninstall -y " + " ".join(d.name for d in drop),
            versions=versions,
        )
    return ok(f"{', '.join(versions)} all at {jax.version}", versions=versions)


def _jax_section(facts: Facts) -> dict[str, Any] | None:
    probe = facts.jax_probe
    if probe is None or probe.outcome != "ok":
        return None
    data = dict(section_of(probe, "jax"))
    data["devices"] = dict_list(data.get("devices"))
    data["log"] = str_list(data.get("log"))
    return data


def check_import(facts: Facts) -> Finding:
    if not facts.live:
        return skip(SNAPSHOT_SKIP)
    probe = facts.jax_probe
    if facts.dists is not None and facts.dist("jax") is None:
        return skip("jax is not installed")
    if probe is None or probe.outcome == "not_run":
        return skip("the jax probe was not run")
    if probe.outcome != "ok":
        return probe_failure(
            probe,
            "jax",
            "python -X faulthandler -c 'import jax; print(jax.devices())'   # shows where it stops",
        )
    data = _jax_section(facts) or {}
    if data.get("missing"):
        return skip("jax is not installed")
    error = data.get("error") or data.get("devices_error")
    if error:
        jax = facts.dist("jax")
        fix = install_fix(facts)
        if jax is not None:
            names = [d.name for d in jax_family(facts)]
            fix = _plugin_line(facts, _wanted_version(facts, jax), names).replace(
                "pip install", "pip install --force-reinstall", 1
            )
        return fail(f"jax fails: {first_line(error)}", fix, error=error)
    return ok(f"jax {data.get('version')} imports (jaxlib {data.get('jaxlib')})")


def check_gpu(facts: Facts) -> Finding:
    if not facts.live:
        return skip(SNAPSHOT_SKIP)
    data = _jax_section(facts)
    if data is None or data.get("missing") or data.get("error") or data.get("devices_error"):
        return skip("jax did not report devices (see jax.import)")
    devices = data.get("devices") or []
    platforms = sorted({str(d.get("platform")) for d in devices})
    gpu_devices = [d for d in devices if d.get("platform") != "cpu"]
    if facts.target not in GPU_TARGETS:
        return ok(
            f"target {facts.target or 'unknown'}: jax runs on {', '.join(platforms) or 'no device'}"
        )
    if gpu_devices:
        return ok(
            f"jax sees {len(gpu_devices)} GPU device(s) ({data.get('platform_version') or platforms[0]})",
            platforms=platforms,
        )
    kind = "rocm" if facts.target in AMD_TARGETS else "cuda"
    plugins = _plugins(facts, kind)
    jax = facts.dist("jax")
    version = _wanted_version(facts, jax) if jax else str(data.get("version"))
    log = [m for m in data["log"] if re.search(r"plugin|rocm|cuda|pjrt|gpu", m, re.I)]
    if plugins:
        names = [d.name for d in plugins]
        return fail(
            f"{', '.join(names)} installed but jax only sees {', '.join(platforms)}"
            + (f": {first_line(log[0])}" if log else ""),
            _plugin_line(facts, version, ["jax", "jaxlib", *names]).replace(
                "pip install", "pip install --force-reinstall", 1
            ),
            log=log,
        )
    locked = [
        str(p.name)
        for p in lock_packages(facts)
        if re.match(rf"^jax-{kind}\d+-(plugin|pjrt)$", str(p.name))
    ]
    if locked:
        fix = _plugin_line(facts, version, locked)
    elif kind == "rocm":
        fix = _plugin_line(facts, version, ["jax-rocm7-plugin", "jax-rocm7-pjrt"])
    else:
        fix = "pip install " + f"'jax[cuda12]=={version}'"
    return warn(f"no jax {kind.upper()} plugin installed: jax runs on the CPU only", fix, log=log)
