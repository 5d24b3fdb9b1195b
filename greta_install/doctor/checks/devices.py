"""Failure mode 4: /dev/kfd and /dev/dri/renderD* must be readable and writable by this user."""

from __future__ import annotations

from greta_install.doctor.facts import DeviceNode, Facts
from greta_install.doctor.model import Finding, fail, ok, skip

from ._common import AMD_TARGETS, amd_gpu_expected

RELOGIN = "then log out and back in (or run `newgrp render` in this shell)"


def _group_fix(facts: Facts, nodes: list[DeviceNode]) -> str:
    groups = facts.groups
    needed = sorted({n.group for n in nodes if n.group} or {"render", "video"})
    if groups is not None:
        stale = [g for g in needed if g in groups.configured and g not in groups.effective]
        if stale and len(stale) == len(needed):
            # Added to the group already, but this login session predates it.
            return f"log out and back in (or run `newgrp {stale[0]}`): this session lacks group {', '.join(stale)}"
    wanted = sorted(set(needed) | {"render", "video"})
    return f"sudo usermod -aG {','.join(wanted)} $USER   # {RELOGIN}"


def _inaccessible(nodes: list[DeviceNode]) -> list[DeviceNode]:
    return [n for n in nodes if n.exists and (n.readable is False or n.writable is False)]


def _describe(node: DeviceNode) -> str:
    owner = f"group {node.group}" if node.group else "unknown group"
    return f"{node.path} ({node.mode or '?'}, {owner})"


def _common_skip(facts: Facts) -> Finding | None:
    if not facts.live:
        return skip("snapshot: device permissions belong to the live user")
    if facts.device_nodes is None:
        return skip("device nodes were not examined")
    if not amd_gpu_expected(facts):
        return skip("no AMD GPU detected")
    if facts.target is not None and facts.target not in AMD_TARGETS:
        return skip(f"target {facts.target} does not use the AMD GPU")
    return None


def check_kfd(facts: Facts) -> Finding:
    if skipped := _common_skip(facts):
        return skipped
    nodes = [n for n in facts.device_nodes or () if n.path == "/dev/kfd"]
    node = nodes[0] if nodes else DeviceNode("/dev/kfd", exists=False)
    in_container = bool(facts.container and facts.container.kind)
    if not node.exists:
        if in_container:
            return skip("/dev/kfd absent inside a container (see container.devices)")
        return fail(
            "/dev/kfd does not exist: the amdgpu kernel driver (KFD) is not loaded",
            "sudo modprobe amdgpu   # then check `sudo dmesg | grep -i -e amdgpu -e kfd` for errors",
        )
    if _inaccessible([node]):
        return fail(
            f"{_describe(node)} is not readable and writable by this user",
            _group_fix(facts, [node]),
            mode=node.mode,
            group=node.group,
        )
    return ok(f"{node.path} is readable and writable", mode=node.mode, group=node.group)


def check_render(facts: Facts) -> Finding:
    if skipped := _common_skip(facts):
        return skipped
    nodes = [n for n in facts.device_nodes or () if n.path.startswith("/dev/dri/renderD")]
    present = [n for n in nodes if n.exists]
    if not present:
        if facts.container and facts.container.kind:
            return skip("no /dev/dri/renderD* inside a container (see container.devices)")
        return fail(
            "no /dev/dri/renderD* node: the amdgpu driver did not bring up the GPU",
            "sudo modprobe amdgpu   # then check `sudo dmesg | grep -i amdgpu` for errors",
        )
    bad = _inaccessible(present)
    if bad:
        return fail(
            f"{', '.join(_describe(n) for n in bad)} not readable and writable by this user",
            _group_fix(facts, bad),
            nodes=[n.path for n in bad],
        )
    return ok(
        f"{len(present)} render node(s) readable and writable: "
        + ", ".join(n.path for n in present),
        nodes=[n.path for n in present],
    )
