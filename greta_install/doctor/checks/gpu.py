"""Detection-based GPU checks; they run on snapshots too.

Failure modes 2 (unofficial APUs), 3 (override environment), 9 (iGPU beside dGPU),
10 (APU carve-out) and SR-IOV hosts.
"""

from __future__ import annotations

from greta_install import archs
from greta_install.doctor.facts import Facts
from greta_install.doctor.gfx import UNOFFICIAL_OVERRIDES, base_arch, override_to_gfx
from greta_install.doctor.model import Finding, fail, ok, skip, warn
from greta_install.model import Gpu

from ._common import detection_gpus, lspci_gpus, primary_gpu

OVERRIDE = "HSA_OVERRIDE_GFX_VERSION"
GIB = 1024**3
# Below this an APU's carve-out cannot hold even a small model; BIOS defaults are 512 MiB-2 GiB.
SMALL_VRAM = 4 * GIB


def _gib(value: int | None) -> str:
    return "unknown" if value is None else f"{value / GIB:.1f} GiB"


def _gpu_name(gpu: Gpu) -> str:
    product = gpu.product
    arch = gpu.arch
    if product and arch:
        return f"{product} ({arch})"
    return str(product or arch or "unknown GPU")


def check_detect(facts: Facts) -> Finding:
    det = facts.detection
    if det is None:
        return warn(
            f"GPU detection did not run: {facts.detection_error or 'unknown reason'}",
            "greta doctor --target cpu   # or mi300x, radeon, instinct, cuda: name the target by hand",
            error=facts.detection_error,
        )
    gpu = primary_gpu(facts)
    warnings = list(det.warnings)
    details = {"target": facts.target, "detected_target": det.target, "warnings": warnings}
    if facts.target_source == "option" and facts.target != det.target:
        return warn(
            f"--target {facts.target} given, but this machine looks like {det.target}"
            + (f" ({_gpu_name(gpu)})" if gpu else ""),
            f"greta doctor --target {det.target}",
            **details,
        )
    notes = f"; {len(warnings)} detection note(s), see `greta detect`" if warnings else ""
    if det.state == "unusable" and det.blockers:
        # What stops the GPU, as detection saw it: "what: fix" per blocker.
        whats = [b.split(": ", 1)[0] for b in det.blockers]
        fixes = [b.split(": ", 1)[1] if ": " in b else b for b in det.blockers]
        return fail(
            f"{len(det.gpus)} GPU(s) present ({_gpu_name(gpu) if gpu else 'unnamed'}) but none "
            f"usable here: {'; '.join(whats)}",
            "\n".join(fixes),
            state=det.state,
            blockers=list(det.blockers),
            **details,
        )
    if gpu is None:
        return ok(f"target {det.target}: no usable GPU detected{notes}", **details)
    if det.target == "cpu":
        return ok(f"target cpu: GRETA has no GPU target for {_gpu_name(gpu)}{notes}", **details)
    others = len(det.gpus) - 1
    extra = f" (+{others} more)" if others > 0 else ""
    return ok(f"target {det.target}: {_gpu_name(gpu)}{extra}{notes}", **details)


def check_sriov(facts: Facts) -> Finding:
    unusable = [g for g in detection_gpus(facts) if not g.usable]
    pci = [d for d in lspci_gpus(facts.lspci) if d.vendor == "1002"]
    gim = [d for d in pci if d.driver == "gim"]
    vfio = [d for d in pci if d.driver == "vfio-pci"]
    if not unusable and not gim:
        if facts.detection is None and not pci:
            return skip("no detection and no lspci output to look at")
        return ok("no GPU is held by an SR-IOV host driver")
    usable_amd = [g for g in detection_gpus(facts, "amd") if g.usable]
    notes = [g.note for g in unusable if g.note]
    finding = "compute is not usable on this host: "
    if gim:
        finding += f"the physical function {gim[0].bus} is bound to the GIM (SR-IOV) driver" + (
            f" and {len(vfio)} virtual function(s) to vfio-pci for guest VMs" if vfio else ""
        )
    else:
        finding += "; ".join(notes) or f"{len(unusable)} GPU(s) are marked unusable"
    fix = (
        "run GPU work inside a guest VM that gets a virtual function, or give the whole GPU "
        "to this host: sudo modprobe -r gim && sudo modprobe amdgpu"
    )
    details = {"gim": [d.bus for d in gim], "vfio": [d.bus for d in vfio], "notes": notes}
    if usable_amd and not gim:
        return warn(finding + f" ({len(usable_amd)} other AMD GPU(s) are usable)", fix, **details)
    return fail(finding, fix, **details)


def check_unofficial(facts: Facts) -> Finding:
    gpu = primary_gpu(facts)
    arch = base_arch(gpu.arch) if gpu is not None else None
    if gpu is None or gpu.vendor != "amd":
        return skip("no AMD GPU is the primary device")
    if arch not in UNOFFICIAL_OVERRIDES:
        return ok(f"{arch or 'unknown arch'} is not one of the unofficial ROCm targets")
    value = UNOFFICIAL_OVERRIDES[arch]
    native = facts.wheel_archs is not None and arch in facts.wheel_archs
    if native:
        return ok(
            f"{_gpu_name(gpu)}: the installed torch wheels carry native {arch} code "
            f"(no {OVERRIDE}={value} needed)",
            arch=arch,
        )
    return warn(
        f"{_gpu_name(gpu)} has no code in these torch wheels; {OVERRIDE}={value} runs it as a "
        "sibling but is reported to cause page faults and system hangs, so GRETA never sets it",
        f"greta install --target radeon --arch {arch}   # the current row carries native {arch} code",
        arch=arch,
        override=value,
    )


def needed_override(facts: Facts) -> str | None:
    """The override the primary GPU needs with the installed row's torch wheels.

    Decided by archs.decide_override, as the install plan decides it: native code
    wins, and an override GRETA never sets automatically (gfx1103) is not "needed".
    """
    gpu = primary_gpu(facts)
    if gpu is None or gpu.vendor != "amd" or not gpu.arch or facts.wheel_archs is None:
        return None
    return archs.decide_override(base_arch(gpu.arch), facts.wheel_archs).value


def check_override(facts: Facts) -> Finding:
    current = facts.env.get(OVERRIDE)
    gpu = primary_gpu(facts)
    native = base_arch(gpu.arch) if gpu is not None else None
    needed = needed_override(facts)
    if current is not None and override_to_gfx(current) is None:
        return fail(
            f"{OVERRIDE}={current!r} is not a version of the form X.Y.Z (e.g. 11.0.0)",
            f"export {OVERRIDE}={needed}" if needed else f"unset {OVERRIDE}",
            current=current,
        )
    if needed and current is None:
        if not facts.env_known:
            return warn(
                f"{native or 'this GPU'} needs {OVERRIDE}={needed}; the snapshot does not "
                "record whether it was set",
                f"export {OVERRIDE}={needed}",
                needed=needed,
            )
        return warn(
            f"{native or 'this GPU'} needs {OVERRIDE}={needed} with the usual wheels, and it is not set",
            f"export {OVERRIDE}={needed}",
            needed=needed,
        )
    if needed and current != needed:
        return warn(
            f"{OVERRIDE}={current} is set, but {native or 'this GPU'} needs {needed}",
            f"export {OVERRIDE}={needed}",
            needed=needed,
            current=current,
        )
    if current and not needed:
        if (
            native
            and native != override_to_gfx(current)
            and gpu is not None
            and gpu.vendor == "amd"
        ):
            return warn(
                f"{OVERRIDE}={current} makes ROCm treat the {native} as "
                f"{override_to_gfx(current)}; this GPU does not need an override",
                f"unset {OVERRIDE}",
                current=current,
                native=native,
            )
        return ok(f"{OVERRIDE}={current} is set", current=current)
    if needed:
        return ok(f"{OVERRIDE}={current} is set as {native} needs", current=current)
    if not facts.env_known:
        return ok(f"no {OVERRIDE} needed (the snapshot does not record the environment)")
    return ok(f"no {OVERRIDE} needed or set")


def check_multi(facts: Facts) -> Finding:
    amd = [g for g in detection_gpus(facts, "amd") if g.usable]
    igpus = [i for i, g in enumerate(amd) if g.integrated]
    dgpus = [i for i, g in enumerate(amd) if not g.integrated]
    if not igpus or not dgpus:
        return (
            ok(f"{len(amd)} usable AMD GPU(s); no iGPU/dGPU mix")
            if amd
            else skip("no AMD GPU detected")
        )
    chosen = {
        k: facts.env[k] for k in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES") if k in facts.env
    }
    names = {"igpu": [_gpu_name(amd[i]) for i in igpus], "dgpu": [_gpu_name(amd[i]) for i in dgpus]}
    if chosen:
        shown = ", ".join(f"{k}={v}" for k, v in chosen.items())
        return ok(f"iGPU and dGPU both present; selection fixed by {shown}", **names, env=chosen)
    if igpus[0] == 0:
        index = dgpus[0]
        return warn(
            f"the integrated {_gpu_name(amd[0])} is device 0 and the discrete "
            f"{_gpu_name(amd[index])} is device {index}: frameworks will pick the iGPU",
            f"export ROCR_VISIBLE_DEVICES={index}   # or HIP_VISIBLE_DEVICES={index}",
            **names,
        )
    return ok(
        f"device 0 is the discrete {_gpu_name(amd[0])}; the iGPU is device {igpus[0]}", **names
    )


def check_apu_memory(facts: Facts) -> Finding:
    """RAM, what the GPU may borrow of it (GTT, capped by TTM), and what torch sees."""
    gpu = primary_gpu(facts)
    if gpu is None or gpu.vendor != "amd" or not gpu.integrated:
        return skip("the primary GPU is not an AMD APU")
    mem = facts.memory
    ram = mem.ram_bytes if mem else None
    gtt = gpu.gtt_bytes if gpu.gtt_bytes is not None else (mem.gtt_bytes if mem else None)
    ttm = mem.ttm_pages_limit * 4096 if mem and mem.ttm_pages_limit else None
    limit = min(v for v in (gtt, ttm) if v is not None) if (gtt or ttm) else None
    seen = _torch_total_memory(facts)
    vram = gpu.vram_bytes
    details = {
        "ram_bytes": ram,
        "vram_bytes": vram,
        "gtt_bytes": gtt,
        "ttm_limit_bytes": ttm,
        "torch_total_memory": seen,
    }
    summary = (
        f"APU {_gpu_name(gpu)}: RAM {_gib(ram)}, VRAM carve-out {_gib(vram)}, GPU-visible "
        f"limit (GTT/TTM) {_gib(limit)}, torch sees {_gib(seen)}"
    )
    # What torch reports is the truth when known; else the best the kernel would allow.
    usable = seen if seen is not None else max((v for v in (vram, limit) if v), default=None)
    if ram and usable is not None and usable < ram // 2:
        pages = (ram * 3 // 4) // 4096
        return warn(
            summary + ": the GPU can use less than half of the machine's memory",
            f"let the GPU borrow 3/4 of RAM: add ttm.pages_limit={pages} amdgpu.gttsize="
            f"{ram * 3 // 4 // (1 << 20)} to GRUB_CMDLINE_LINUX_DEFAULT in /etc/default/grub, "
            "sudo update-grub && sudo reboot; and export "
            "PYTORCH_HIP_ALLOC_CONF=expandable_segments:True (fewer out-of-memory errors from "
            "fragmentation); or raise 'UMA Frame Buffer Size' in the BIOS/UEFI setup",
            **details,
        )
    if vram is not None and vram < SMALL_VRAM and seen is None:
        return warn(
            summary + ": models larger than the carve-out fail to allocate or spill",
            "raise 'UMA Frame Buffer Size' (or 'iGPU Memory') in the BIOS/UEFI setup to 8G or more; "
            "or enlarge GTT: add amdgpu.gttsize=<MiB> to GRUB_CMDLINE_LINUX_DEFAULT in "
            "/etc/default/grub, then sudo update-grub && sudo reboot",
            **details,
        )
    if usable is None:
        # "ok" needs a number to be ok about: say what could not be read instead.
        unknown = [k for k, v in details.items() if v is None]
        return skip(
            summary + f": not measured ({', '.join(unknown)} unknown: the RAM size from "
            "/proc/meminfo and the GTT/TTM limits from sysfs are needed)",
            **details,
        )
    return ok(summary, **details)


def _torch_total_memory(facts: Facts) -> int | None:
    probe = facts.torch_probe
    if probe is None or probe.outcome != "ok":
        return None
    torch = probe.data.get("torch")
    if not isinstance(torch, dict):
        return None
    for device in torch.get("devices") or []:
        if isinstance(device, dict) and isinstance(device.get("total_memory"), int):
            return int(device["total_memory"])
    return None
