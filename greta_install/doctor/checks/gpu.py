"""Detection-based GPU checks; they run on snapshots too.

Failure modes 2 (unofficial APUs), 3 (override environment), 9 (iGPU beside dGPU),
10 (APU carve-out) and SR-IOV hosts.
"""

from __future__ import annotations

from greta_install.doctor.facts import Facts
from greta_install.doctor.gfx import UNOFFICIAL_OVERRIDES, base_arch, override_to_gfx
from greta_install.doctor.model import Finding, fail, ok, skip, warn

from ._common import detection_gpus, lspci_gpus, primary_gpu

OVERRIDE = "HSA_OVERRIDE_GFX_VERSION"
GIB = 1024**3
# Below this an APU's carve-out cannot hold even a small model; BIOS defaults are 512 MiB-2 GiB.
SMALL_VRAM = 4 * GIB


def _gib(value: int | None) -> str:
    return "unknown" if value is None else f"{value / GIB:.1f} GiB"


def _gpu_name(gpu: object) -> str:
    product = getattr(gpu, "product", None)
    arch = getattr(gpu, "arch", None)
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
    warnings = list(getattr(det, "warnings", None) or [])
    details = {"target": facts.target, "detected_target": det.target, "warnings": warnings}
    if facts.target_source == "option" and facts.target != det.target:
        return warn(
            f"--target {facts.target} given, but this machine looks like {det.target}"
            + (f" ({_gpu_name(gpu)})" if gpu else ""),
            f"greta doctor --target {det.target}",
            **details,
        )
    notes = f"; {len(warnings)} detection note(s), see `greta detect`" if warnings else ""
    if gpu is None:
        return ok(f"target {det.target}: no usable GPU detected{notes}", **details)
    if det.target == "cpu":
        return ok(f"target cpu: GRETA has no GPU target for {_gpu_name(gpu)}{notes}", **details)
    others = len(getattr(det, "gpus", []) or []) - 1
    extra = f" (+{others} more)" if others > 0 else ""
    return ok(f"target {det.target}: {_gpu_name(gpu)}{extra}{notes}", **details)


def check_sriov(facts: Facts) -> Finding:
    unusable = [g for g in detection_gpus(facts) if getattr(g, "usable", True) is False]
    pci = [d for d in lspci_gpus(facts.lspci) if d.vendor == "1002"]
    gim = [d for d in pci if d.driver == "gim"]
    vfio = [d for d in pci if d.driver == "vfio-pci"]
    if not unusable and not gim:
        if facts.detection is None and not pci:
            return skip("no detection and no lspci output to look at")
        return ok("no GPU is held by an SR-IOV host driver")
    usable_amd = [g for g in detection_gpus(facts, "amd") if getattr(g, "usable", True)]
    notes = [getattr(g, "note", None) for g in unusable if getattr(g, "note", None)]
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
    arch = base_arch(getattr(gpu, "arch", None))
    if gpu is None or getattr(gpu, "vendor", None) != "amd":
        return skip("no AMD GPU is the primary device")
    if arch not in UNOFFICIAL_OVERRIDES:
        return ok(f"{arch or 'unknown arch'} is not one of the unofficial ROCm targets")
    value = UNOFFICIAL_OVERRIDES[arch]
    return warn(
        f"{_gpu_name(gpu)} is not an official ROCm target: ROCm runs it only through "
        f"{OVERRIDE}={value}, which is experimental and reported to hang on some APUs",
        f"export {OVERRIDE}={value}   # if torch hangs, `unset {OVERRIDE}` and use --target cpu",
        arch=arch,
        override=value,
    )


def check_override(facts: Facts) -> Finding:
    det = facts.detection
    needed = (getattr(det, "env", None) or {}).get(OVERRIDE) if det is not None else None
    current = facts.env.get(OVERRIDE)
    gpu = primary_gpu(facts)
    native = base_arch(getattr(gpu, "arch", None))
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
        if native and native != override_to_gfx(current) and getattr(gpu, "vendor", None) == "amd":
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
    amd = [g for g in detection_gpus(facts, "amd") if getattr(g, "usable", True)]
    igpus = [i for i, g in enumerate(amd) if getattr(g, "integrated", False)]
    dgpus = [i for i, g in enumerate(amd) if not getattr(g, "integrated", False)]
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
    gpu = primary_gpu(facts)
    if (
        gpu is None
        or getattr(gpu, "vendor", None) != "amd"
        or not getattr(gpu, "integrated", False)
    ):
        return skip("the primary GPU is not an AMD APU")
    vram = getattr(gpu, "vram_bytes", None)
    gtt = getattr(gpu, "gtt_bytes", None)
    details = {"vram_bytes": vram, "gtt_bytes": gtt}
    if vram is None:
        return ok(f"APU {_gpu_name(gpu)}: VRAM carve-out size unknown, GTT {_gib(gtt)}", **details)
    if vram < SMALL_VRAM:
        return warn(
            f"APU {_gpu_name(gpu)} has a {_gib(vram)} VRAM carve-out (GTT {_gib(gtt)}): "
            "models larger than the carve-out fail to allocate or spill",
            "raise 'UMA Frame Buffer Size' (or 'iGPU Memory') in the BIOS/UEFI setup to 8G or more; "
            "or enlarge GTT: add amdgpu.gttsize=<MiB> to GRUB_CMDLINE_LINUX_DEFAULT in "
            "/etc/default/grub, then sudo update-grub && sudo reboot",
            **details,
        )
    return ok(f"APU {_gpu_name(gpu)}: VRAM {_gib(vram)}, GTT {_gib(gtt)}", **details)
