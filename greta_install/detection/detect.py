"""Detection: merge the evidence into physical GPUs, pick the primary GPU and the target.

``detect(view)`` reads through `greta_install.detection.evidence` and never raises; everything
after that (``conclude``) is a pure function of the parsed evidence, so snapshots of
real machines test it exactly as it runs on them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from greta_install import archs
from greta_install.detection import pci_ids
from greta_install.detection.evidence import Evidence, ToolPolicy, gather
from greta_install.detection.parsers.lspci import AMD, NVIDIA
from greta_install.detection.system_view import SystemView
from greta_install.model import Detection, Gpu, Target

MAX_PROBLEMS_SHOWN = 3
GENERIC_NAMES = frozenset({"amd radeon graphics", "radeon graphics", "amd radeon(tm) graphics"})
AMD_COMPUTE_DRIVERS = frozenset({"amdgpu"})
NVIDIA_COMPUTE_DRIVERS = frozenset({"nvidia"})


@dataclass
class _Seen:
    """One physical GPU while evidence is merged: what each source said about it."""

    vendor: str
    sources: list[str] = field(default_factory=list)
    pci_bus: str | None = None
    device_id: str | None = None
    revision: int | None = None
    gfx: dict[str, str] = field(default_factory=dict)  # source -> gfx
    names: dict[str, str] = field(default_factory=dict)  # source -> product name
    driver: str | None = None
    driver_source: str | None = None
    modules: tuple[str, ...] = ()
    vram: int | None = None
    gtt: int | None = None
    cus: int | None = None
    apu_flag: bool = False
    num_xcc: int | None = None
    compute_cap: str | None = None
    nv_architecture: str | None = None
    partition: str | None = None
    ids: dict[str, str] = field(default_factory=dict)  # "node"/"kfd_id"/"unique_id" -> value
    soc: bool = False  # an NVIDIA GPU without a PCI bus id (Jetson-class SoC)

    def add(self, source: str, bus: str | None = None, device_id: str | None = None) -> None:
        if source not in self.sources:
            self.sources.append(source)
        # Keep the fullest address: one with the PCI domain beats one without.
        if bus and (self.pci_bus is None or bus.count(":") > self.pci_bus.count(":")):
            self.pci_bus = bus
        if device_id and self.device_id is None:
            self.device_id = device_id


def _short_bus(bus: str | None) -> str | None:
    """ "0000:85:00.0" -> "85:00.0": lspci without -D and rocminfo omit the domain."""
    if bus is None:
        return None
    return bus[-7:] if len(bus) > 7 else bus


def _same_bus(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return False
    if a.count(":") == 2 and b.count(":") == 2:
        return a == b
    return _short_bus(a) == _short_bus(b)


def _ids(**values: object) -> dict[str, str]:
    """Identity keys a source gives (KFD node, KFD gpu_id, unique id), without blanks."""
    return {k: str(v).strip().lower() for k, v in values.items() if v not in (None, "")}


def _unique_id(value: str | None) -> str | None:
    """rocminfo "GPU-67c63ac3c3c637f9" and rocm-smi "0x67c63ac3c3c637f9" are one id."""
    text = (value or "").strip().lower().removeprefix("gpu-").removeprefix("0x")
    return text if len(text) >= 8 and all(c in "0123456789abcdef" for c in text) else None


def _match(
    seen: list[_Seen],
    vendor: str,
    source: str,
    bus: str | None,
    device_id: str | None,
    ids: dict[str, str] | None = None,
) -> _Seen:
    """The GPU this observation is about, creating it when no earlier source saw it.

    Match by PCI address first, then by an identity key two tools share (KFD node,
    KFD gpu_id = rocm-smi GUID = amd-smi KFD_ID, unique id); without any, by device id
    and order (the n-th GPU a bus-less source lists is the n-th not yet claimed by that
    source). A GPU whose identity keys contradict the observation is never chosen.
    """
    ids = ids or {}

    def compatible(s: _Seen) -> bool:
        return not any(k in s.ids and s.ids[k] != v for k, v in ids.items())

    free = [s for s in seen if s.vendor == vendor and source not in s.sources and compatible(s)]
    found = None
    if bus is not None:
        found = next((s for s in free if _same_bus(s.pci_bus, bus)), None)
    if found is None and ids:
        found = next((s for s in free if any(s.ids.get(k) == v for k, v in ids.items())), None)
    if found is None:
        # A GPU another bus-carrying source placed elsewhere is not this one.
        found = next(
            (
                s
                for s in free
                if (bus is None or s.pci_bus is None)
                and (device_id is None or s.device_id in (None, device_id))
            ),
            None,
        )
    if found is None:
        found = _Seen(vendor=vendor)
        seen.append(found)
    found.add(source, bus, device_id)
    for key, value in ids.items():
        found.ids.setdefault(key, value)
    return found


def _merge(ev: Evidence) -> list[_Seen]:
    seen: list[_Seen] = []
    for node in ev.kfd:
        if not node.is_gpu or (node.vendor_id not in (None, 0, AMD)):
            continue
        s = _match(
            seen,
            "amd",
            "kfd",
            node.pci_bus,
            node.device_id,
            _ids(node=node.node, kfd_id=node.gpu_id),
        )
        if node.gfx:
            s.gfx["kfd"] = node.gfx
        s.cus = s.cus or node.compute_units
        s.num_xcc = node.num_xcc
    for card in ev.drm:
        vendor = {AMD: "amd", NVIDIA: "nvidia"}.get(card.vendor_id or 0)
        if vendor is None:
            continue
        s = _match(seen, vendor, "drm", card.pci_bus, card.device_id)
        s.revision = s.revision if s.revision is not None else card.revision
        s.vram = s.vram or card.vram_bytes
        s.gtt = s.gtt or card.gtt_bytes
        if card.driver and s.driver is None:
            s.driver, s.driver_source = card.driver, "drm"
    for agent in ev.rocminfo:
        if agent.device_type != "GPU":
            continue
        s = _match(
            seen,
            "amd",
            "rocminfo",
            agent.pci_bus,
            agent.chip_id,
            _ids(node=agent.node, unique_id=_unique_id(agent.uuid)),
        )
        if agent.gfx:
            s.gfx["rocminfo"] = agent.gfx
        if agent.marketing_name:
            s.names["rocminfo"] = agent.marketing_name
        s.cus = agent.compute_units or s.cus
        s.apu_flag = s.apu_flag or agent.apu
    for g in ev.amd_smi:
        s = _match(
            seen, "amd", "amd-smi", g.pci_bus, g.device_id, _ids(node=g.node_id, kfd_id=g.kfd_id)
        )
        if g.gfx:
            s.gfx["amd-smi"] = g.gfx
        name = g.market_name or g.product_name
        if name:
            s.names["amd-smi"] = name
        s.revision = s.revision if s.revision is not None else g.revision
        s.vram = s.vram or g.vram_bytes
        s.cus = s.cus or g.compute_units
        s.partition = s.partition or g.compute_partition
    for g in ev.rocm_smi:
        s = _match(
            seen,
            "amd",
            "rocm-smi",
            g.pci_bus,
            g.device_id,
            _ids(node=g.node, kfd_id=g.guid, unique_id=_unique_id(g.unique_id)),
        )
        if g.gfx:
            s.gfx["rocm-smi"] = g.gfx
        if g.product:
            s.names["rocm-smi"] = g.product
        s.revision = s.revision if s.revision is not None else g.revision
        s.partition = s.partition or g.partition
    for dev in ev.lspci:
        if not dev.is_gpu:
            continue
        vendor = "amd" if dev.vendor_id == AMD else "nvidia"
        s = _match(seen, vendor, "lspci", dev.slot, dev.device_id)
        s.names.setdefault("lspci", dev.name)
        s.revision = s.revision if s.revision is not None else dev.revision
        if dev.driver or dev.modules:
            # lspci -k is the only source that sees a function bound to another driver
            # (gim, vfio-pci): it overrides drm, which only lists DRM drivers.
            s.driver, s.driver_source, s.modules = dev.driver, "lspci", dev.modules
    for g in ev.nvidia_smi:
        s = _match(seen, "nvidia", "nvidia-smi", g.pci_bus, g.device_id)
        if g.name:
            s.names["nvidia-smi"] = g.name
        s.compute_cap = g.compute_cap
        s.nv_architecture = g.architecture
        s.soc = s.soc or g.integrated
        if g.memory_mib:
            s.vram = s.vram or g.memory_mib * 1024 * 1024
    return seen


@dataclass
class _Built:
    gpu: Gpu
    warnings: list[str]
    arch_is_runtime_view: bool = False  # arch only known from rocminfo


def _amd_gpu(s: _Seen, ev: Evidence) -> _Built:
    warnings: list[str] = []
    notes: list[str] = []
    info = pci_ids.lookup(s.device_id, s.revision) if s.device_id else None
    if info is None:
        # No device id a table knows (the plain amd-smi table, rocm-smi --csv): the
        # product name still names the model.
        for source in ("amd-smi", "rocm-smi", "lspci", "rocminfo"):
            info = pci_ids.lookup_name(s.names.get(source))
            if info:
                notes.append(f"architecture from the product name {s.names[source]!r}")
                break
    if info and info.note:
        notes.append(f"PCI table: {info.note}")
    native = s.gfx.get("kfd") or s.gfx.get("amd-smi") or s.gfx.get("rocm-smi")
    native = native or (info.gfx if info else None)
    runtime = s.gfx.get("rocminfo")
    arch = native or runtime
    where = s.pci_bus or s.device_id or f"({', '.join(s.sources)}: no bus or device id)"
    if native and runtime and native != runtime:
        seen_override = ev.env.get("HSA_OVERRIDE_GFX_VERSION")
        cause = (
            f"HSA_OVERRIDE_GFX_VERSION={seen_override} is set"
            if seen_override
            else "it ran under HSA_OVERRIDE_GFX_VERSION"
        )
        notes.append(f"rocminfo reports {runtime} (the runtime's view); the device is {native}")
        warnings.append(
            f"GPU {where}: rocminfo reports {runtime} but the device ({s.device_id or 'id unknown'}) "
            f"is natively {native}: {cause}; using {native}"
        )
    only_runtime = arch is not None and native is None
    if only_runtime and ev.env.get("HSA_OVERRIDE_GFX_VERSION"):
        warnings.append(
            f"GPU {where}: only rocminfo named the architecture ({runtime}) and "
            f"HSA_OVERRIDE_GFX_VERSION={ev.env['HSA_OVERRIDE_GFX_VERSION']} is set, so it may be "
            "the overridden one, not the card's"
        )

    product = None
    rocminfo_name = s.names.get("rocminfo")
    if rocminfo_name and rocminfo_name.strip().lower() not in GENERIC_NAMES:
        product = rocminfo_name
    product = product or (info.product if info else None)
    for source in ("rocm-smi", "amd-smi", "lspci", "rocminfo"):
        product = product or s.names.get(source)

    datacenter_apu = s.device_id in archs.DATACENTER_APU_IDS
    integrated = archs.is_integrated(arch) if arch else (s.apu_flag and not datacenter_apu)
    if datacenter_apu:
        notes.append("datacenter APU: CPU and GPU share the HBM")
    if s.device_id in archs.SRIOV_VF_IDS:
        notes.append("SR-IOV virtual function (the GPU as a VM guest sees it)")
    full_xcc = archs.XCC_PER_DEVICE.get(s.device_id or "")
    if full_xcc and s.num_xcc and s.num_xcc < full_xcc:
        notes.append(f"one compute partition: {s.num_xcc} of the device's {full_xcc} XCDs")
    if s.partition and s.partition.upper() not in ("SPX", "N/A"):
        notes.append(f"compute partition mode {s.partition}")

    usable = True
    if s.driver_source == "lspci" and s.driver is None and s.modules:
        usable = False
        notes.append("no kernel driver bound")
        warnings.append(f"GPU {where}: no kernel driver is bound (modules: {', '.join(s.modules)})")
    elif s.driver and s.driver not in AMD_COMPUTE_DRIVERS:
        usable = False
        notes.append(f"bound to {s.driver}, not amdgpu")
        warnings.append(_foreign_driver_warning(where, s.driver, product))
    runtime_block = _runtime_blocker(ev)
    if usable and runtime_block:
        usable = False
        notes.append(runtime_block[0])
    if s.sources == ["lspci"] and usable:
        warnings.append(
            f"GPU {where}: seen only by lspci; KFD and the ROCm tools did not show it "
            "(amdgpu not loaded, no /dev/kfd in this container, or not captured in the snapshot)"
        )
    if arch is None:
        why = (
            f"device id {s.device_id} is not in GRETA's PCI table and no ROCm tool named it"
            if s.device_id
            else "no source gave its device id or architecture"
        )
        warnings.append(
            f"GPU {where}: could not tell its architecture ({why}); please attach "
            "`greta snapshot` output to a bug report"
        )
    gpu = Gpu(
        vendor="amd",
        arch=arch,
        product=product,
        pci_id=s.device_id,
        integrated=integrated,
        evidence=tuple(s.sources),
        pci_bus=s.pci_bus,
        vram_bytes=s.vram,
        gtt_bytes=s.gtt,
        compute_units=s.cus,
        usable=usable,
        note="; ".join(notes) or None,
    )
    return _Built(gpu, warnings, only_runtime)


def _runtime_blocker(ev: Evidence) -> tuple[str, str] | None:
    """(what, fix) when the ROCm runtime itself said it cannot reach the GPUs here."""
    if ev.info.get("rocminfo.rock_module") == "not loaded":
        return (
            "the amdgpu kernel driver (ROCk) is not loaded",
            "load it: `sudo modprobe amdgpu` (if that fails, install the amdgpu driver for "
            "this kernel, e.g. `sudo apt install amdgpu-dkms`, and reboot)",
        )
    error = ev.info.get("rocminfo.kfd_open_error")
    device = ev.info.get("dev.kfd")
    if error is None and device == "absent":
        error = "No such file or directory"
    elif error is None and device == "denied":
        error = "Permission denied"
    if error is None:
        return None
    what = f"ROCm cannot open /dev/kfd ({error})"
    low = error.lower()
    if "no such file" in low:
        return (
            what,
            "this container has no /dev/kfd: start it with "
            "`--device=/dev/kfd --device=/dev/dri --group-add video --group-add render`",
        )
    if "permission" in low or "not permitted" in low:
        return (
            what,
            "add this user to the render and video groups: `sudo usermod -aG render,video "
            "$USER` and log in again; in a container, start it with `--device=/dev/kfd "
            "--device=/dev/dri --group-add video --group-add render`",
        )
    return (
        what,
        "the kernel refused /dev/kfd: in an unprivileged container or LXC pass the host's "
        "/dev/kfd and /dev/dri through (`--device=/dev/kfd --device=/dev/dri`) with a "
        "matching amdgpu driver on the host, or run on the host itself",
    )


def _foreign_driver_warning(where: str, driver: str, product: str | None) -> str:
    name = product or "AMD GPU"
    if driver == "gim":
        return (
            f"GPU {where} ({name}) is an SR-IOV physical function bound to the gim driver: this "
            "is a virtualisation host, compute runs in the VMs that get its virtual functions, "
            "not here"
        )
    if driver.startswith("vfio"):
        return (
            f"GPU {where} ({name}) is bound to {driver} for passthrough to a VM: "
            "not usable for compute on this host"
        )
    return (
        f"GPU {where} ({name}) is bound to the {driver} driver, not amdgpu: not usable for compute"
    )


def _nvidia_gpu(s: _Seen) -> _Built:
    warnings: list[str] = []
    name = s.names.get("nvidia-smi") or s.names.get("lspci")
    arch = archs.sm_from_compute_cap(s.compute_cap) or archs.sm_from_name(name, s.nv_architecture)
    where = s.pci_bus or s.device_id or f"({', '.join(s.sources)}: no bus or device id)"
    if arch is None:
        warnings.append(
            f"NVIDIA GPU {where} ({name or 'unnamed'}): compute capability unknown"
            + (
                "; nvidia-smi did not run or did not list it"
                if "nvidia-smi" not in s.sources
                else ""
            )
        )
    usable = True
    notes: list[str] = []
    if s.soc:
        notes.append("no PCI bus id: an integrated (Jetson-class, aarch64) GPU")
        warnings.append(
            f"NVIDIA GPU {name or 'unnamed'} has no PCI bus id: an integrated GPU of an "
            "aarch64 SoC (Jetson class). GRETA's locks are built for x86_64 Linux only, so "
            "no locked build installs here; use NVIDIA's JetPack wheels instead"
        )
    if s.driver_source == "lspci" and s.driver is None and s.modules:
        usable = False
        notes.append("no kernel driver bound")
    elif s.driver and s.driver not in NVIDIA_COMPUTE_DRIVERS:
        usable = False
        notes.append(f"bound to {s.driver}, not nvidia")
        warnings.append(f"NVIDIA GPU {where} is bound to {s.driver}: not usable for compute")
    gpu = Gpu(
        vendor="nvidia",
        arch=arch,
        product=name,
        pci_id=s.device_id,
        integrated=s.soc,
        evidence=tuple(s.sources),
        pci_bus=s.pci_bus,
        vram_bytes=s.vram,
        compute_units=None,
        usable=usable,
        note="; ".join(notes) or None,
    )
    return _Built(gpu, warnings)


def _supported(gpu: Gpu) -> bool:
    return archs.locked_build_supports(
        gpu.vendor, gpu.arch, soc=gpu.vendor == "nvidia" and gpu.integrated
    )


def _target_of(gpu: Gpu) -> Target | None:
    if gpu.vendor == "nvidia":
        return "cuda" if _supported(gpu) or (gpu.arch is None and not gpu.integrated) else None
    return archs.target_for_gfx(gpu.arch)


def _rank(gpu: Gpu) -> tuple:
    return archs.usability_rank(
        gpu.vendor,
        gpu.arch,
        usable=gpu.usable,
        integrated=gpu.integrated,
        compute_units=gpu.compute_units,
        memory_bytes=gpu.vram_bytes,
        soc=gpu.vendor == "nvidia" and gpu.integrated,
    )


def _pick_primary(gpus: list[Gpu]) -> int | None:
    """The GPU a user can run the most on (archs.usability_rank); ties: the first listed."""
    if not gpus:
        return None
    return max(range(len(gpus)), key=lambda i: (_rank(gpus[i]), -i))


def _describe(i: int, g: Gpu) -> str:
    return f"GPU {i} ({g.product or 'unnamed'}, {g.arch or 'arch unknown'})"


def _skip_reason(g: Gpu, primary: Gpu) -> str:
    if not g.usable:
        return "not usable for compute here"
    if not _supported(g):
        if g.vendor == "nvidia" and g.integrated:
            return "an integrated SoC GPU (aarch64): no locked build"
        if g.vendor == "nvidia":
            return (
                ("" if g.arch else "compute capability unknown; ")
                + f"the cuda target's torch wheels carry code for sm_{archs.CUDA_MIN_SM} and "
                "newer only"
            )
        return f"no locked build supports it ({archs.unsupported_reason(g.arch)})"
    if g.integrated and not primary.integrated:
        return "an integrated GPU; the discrete GPU runs more"
    if (g.compute_units or 0) < (primary.compute_units or 0):
        return f"fewer compute units ({g.compute_units} vs {primary.compute_units})"
    if (g.vram_bytes or 0) < (primary.vram_bytes or 0):
        return "less memory than the primary"
    return "a different GPU model"


def _env_fixes(det: Detection, ev: Evidence, amd: list[tuple[int, Gpu]]) -> list[str]:
    warnings: list[str] = []
    gpu = det.primary_gpu
    seen_override = ev.env.get("HSA_OVERRIDE_GFX_VERSION")
    if gpu is None or gpu.vendor != "amd" or det.target == "cpu":
        if seen_override and not amd:
            warnings.append(
                f"HSA_OVERRIDE_GFX_VERSION={seen_override} is set but there is no AMD GPU: unset it"
            )
        return warnings
    # Whether an override is needed depends on the torch wheels (the ROCm 7.14 row
    # carries every Radeon arch natively): the install plan decides, from archs.py.
    facts = archs.arch_facts(gpu.arch)
    if facts.warning:
        warnings.append(facts.warning)
    known = facts.override
    if seen_override and known and seen_override.strip() != known:
        warnings.append(
            f"HSA_OVERRIDE_GFX_VERSION={seen_override} is set, but {gpu.arch} can only run as "
            f"{facts.runs_as} ({known})"
        )
    elif seen_override and not known:
        warnings.append(
            f"HSA_OVERRIDE_GFX_VERSION={seen_override} is set, but {gpu.arch} needs no "
            "override: unset it (it makes the runtime load code for another GPU)"
        )
    # With an iGPU beside the discrete GPU, ROCm device 0 may be the iGPU (and an
    # override meant for one applies to both): show the runtime only the chosen kind.
    runtime = [(i, g) for i, g in amd if "kfd" in g.evidence or "rocminfo" in g.evidence]
    if not gpu.integrated and any(g.integrated for _, g in runtime):
        keep = [str(n) for n, (_, g) in enumerate(runtime) if not g.integrated and g.usable]
        already = [v for v in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES") if v in ev.env]
        if keep and not already:
            det.env["ROCR_VISIBLE_DEVICES"] = ",".join(keep)
            warnings.append(
                "an integrated GPU is visible beside the discrete one: ROCR_VISIBLE_DEVICES="
                f"{','.join(keep)} keeps ROCm programs on the discrete GPU"
            )
    return warnings


def _visibility_warnings(ev: Evidence, gpus: list[Gpu]) -> list[str]:
    warnings = []
    n_amd = sum(g.vendor == "amd" for g in gpus)
    n_nv = sum(g.vendor == "nvidia" for g in gpus)
    for var in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        if var not in ev.env:
            continue
        value = ev.env[var].strip()
        # HIP honours CUDA_VISIBLE_DEVICES too, so it matters on AMD machines as well.
        count = n_nv if var == "CUDA_VISIBLE_DEVICES" and n_nv else n_amd
        if count == 0 and var != "CUDA_VISIBLE_DEVICES":
            continue
        if value in ("", "-1"):
            warnings.append(f"{var}={value!r} hides every GPU from programs started here")
        else:
            warnings.append(
                f"{var}={value} is set: programs see only device(s) {value} of the {count} "
                "GPU(s) listed here (detection lists them all)"
            )
    return warnings


def _source_warnings(ev: Evidence) -> list[str]:
    out: list[str] = []
    for source, problems in ev.problems.items():
        for problem in problems[:MAX_PROBLEMS_SHOWN]:
            out.append(problem if problem.startswith(source) else f"{source}: {problem}")
        if len(problems) > MAX_PROBLEMS_SHOWN:
            out.append(f"{source}: {len(problems) - MAX_PROBLEMS_SHOWN} more problem(s) not shown")
    return out


def _blockers(ev: Evidence, gpus: list[Gpu]) -> list[str]:
    """What stops every GPU here, each with the fix, for the plan's blockers."""
    out: list[str] = []
    runtime = _runtime_blocker(ev)
    if runtime:
        out.append(f"{runtime[0]}: {runtime[1]}")
    notes = " ".join(g.note or "" for g in gpus)
    if "gim" in notes:
        out.append(
            "this host hands its GPU to virtual machines (SR-IOV, gim driver): install "
            "inside a VM that gets a virtual function"
        )
    if "vfio" in notes:
        out.append(
            "the GPU is bound to vfio-pci for passthrough: install inside the VM that owns "
            "it, or unbind it from vfio-pci and load amdgpu on this host"
        )
    if "no kernel driver bound" in notes:
        out.append(
            "no kernel driver is bound to the GPU: load it (`sudo modprobe amdgpu` or "
            "`sudo modprobe nvidia`) and check `dmesg` for why it did not bind"
        )
    return out or [
        "no GPU here is usable for compute and the evidence does not say why: run "
        "`greta doctor` and attach `greta snapshot` to a bug report"
    ]


def conclude(ev: Evidence) -> Detection:
    """Pure: the detection for a set of parsed evidence."""
    warnings = _source_warnings(ev)
    built = []
    for s in _merge(ev):
        built.append(_amd_gpu(s, ev) if s.vendor == "amd" else _nvidia_gpu(s))
    gpus = [b.gpu for b in built]
    for b in built:
        warnings.extend(b.warnings)

    primary = _pick_primary(gpus)
    det = Detection(target="cpu", primary=primary, gpus=gpus, env_seen=dict(ev.env))
    gpu = det.primary_gpu
    if gpu is None:
        warnings.append(
            "no GPU found: the cpu target (torch CPU build, Triton interpreter, jax CPU)"
        )
    else:
        target = _target_of(gpu)
        if target is None:
            det.target = "cpu"
            why = (
                _skip_reason(gpu, gpu)
                if gpu.vendor == "nvidia"
                else archs.unsupported_reason(gpu.arch)
            )
            warnings.append(f"{_describe(primary or 0, gpu)}: {why}; using the cpu target")
        else:
            det.target = target
        if not gpu.usable:
            warnings.append(
                f"no GPU here is usable for compute; the target names the hardware "
                f"({det.target}), but programs on this machine cannot use it"
            )
            det.blockers = _blockers(ev, gpus)
        sm = archs.sm_number(gpu.arch) if gpu.vendor == "nvidia" else None
        if sm is not None and sm < 70:
            warnings.append(
                f"{_describe(primary or 0, gpu)} is older than Volta (sm_70): current CUDA "
                "wheels of torch no longer carry code for it"
            )
        for i, other in enumerate(gpus):
            if i == primary or (other.arch, other.product, other.usable) == (
                gpu.arch,
                gpu.product,
                gpu.usable,
            ):
                continue
            warnings.append(
                f"skipped {_describe(i, other)}: {_skip_reason(other, gpu)}; "
                f"primary is {_describe(primary or 0, gpu)}"
            )
    amd = [(i, g) for i, g in enumerate(gpus) if g.vendor == "amd"]
    warnings.extend(_env_fixes(det, ev, amd))
    warnings.extend(_visibility_warnings(ev, gpus))

    det.rocm_version = ev.info.get("rocm-version.version") or ev.info.get("hipconfig.version")
    if gpu is not None and gpu.vendor == "nvidia":
        det.driver_version = ev.info.get("nvidia-smi.driver_version") or ev.info.get(
            "nvidia-proc.driver_version"
        )
    else:
        det.driver_version = (
            ev.info.get("amdgpu-module.version")
            or ev.info.get("rocm-smi.driver_version")
            or next((g.driver_version for g in ev.amd_smi if g.driver_version), None)
        )
    det.cuda_version = ev.info.get("nvidia-smi.cuda_version")
    det.state = "none" if not gpus else ("usable" if any(g.usable for g in gpus) else "unusable")
    det.sources = dict(ev.status)
    det.warnings = list(dict.fromkeys(warnings))
    return det


def detect(view: SystemView, tools: ToolPolicy | None = None) -> Detection:
    """What this machine (or snapshot) is; never raises on bad input."""
    try:
        return conclude(gather(view, tools))
    except Exception as exc:  # a detection bug must not stop `greta install` or the doctor
        return Detection(
            target="cpu",
            primary=None,
            warnings=[
                f"detection failed ({exc.__class__.__name__}: {exc}); using the cpu target. "
                "Please report it with the output of `greta snapshot`"
            ],
        )
