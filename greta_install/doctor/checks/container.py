"""Container detection, and failure mode 5: a container started without the GPU devices."""

from __future__ import annotations

from greta_install.doctor.facts import Facts
from greta_install.doctor.model import Finding, fail, ok, skip

from ._common import AMD_TARGETS, amd_gpu_expected, nvidia_gpu_expected

AMD_RUN = (
    "docker run --device=/dev/kfd --device=/dev/dri --group-add video "
    "--group-add $(getent group render | cut -d: -f3) --ipc=host IMAGE ..."
    "   # on the host; podman takes the same --device flags"
)
NVIDIA_RUN = "docker run --gpus all IMAGE ...   # on the host, with the NVIDIA Container Toolkit"


def check_detect(facts: Facts) -> Finding:
    info = facts.container
    if info is None:
        if not facts.live:
            return skip("the snapshot records no container markers")
        return skip("container markers were not examined")
    if info.kind:
        return ok(f"inside a {info.kind} container", kind=info.kind, evidence=list(info.evidence))
    return ok("not inside a container")


def check_devices(facts: Facts) -> Finding:
    info = facts.container
    if info is None or not info.kind:
        return skip("not inside a container")
    if facts.device_nodes is None:
        return skip("the device nodes of this container are unknown (snapshot without dev/)")
    present = {n.path for n in facts.device_nodes if n.exists}
    wants_amd = amd_gpu_expected(facts) and facts.target in (None, *AMD_TARGETS)
    wants_nvidia = nvidia_gpu_expected(facts) and facts.target in (None, "cuda")
    findings: list[str] = []
    fixes: list[str] = []
    if wants_amd:
        missing = []
        if "/dev/kfd" not in present:
            missing.append("/dev/kfd")
        if not any(p.startswith("/dev/dri/renderD") for p in present):
            missing.append("/dev/dri/renderD*")
        if missing:
            findings.append(
                f"an AMD GPU is on the host but {' and '.join(missing)} are not in the container"
            )
            fixes.append(AMD_RUN)
    if wants_nvidia and not any(p.startswith("/dev/nvidia") for p in present):
        findings.append("an NVIDIA GPU is on the host but no /dev/nvidia* node is in the container")
        fixes.append(NVIDIA_RUN)
    if findings:
        return fail("; ".join(findings), "\n".join(fixes), kind=info.kind)
    if not wants_amd and not wants_nvidia:
        return ok(f"no GPU for target {facts.target or 'unknown'} to pass into this container")
    return ok("the GPU device nodes are passed into the container", kind=info.kind)
