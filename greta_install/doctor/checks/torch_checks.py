"""PyTorch, read from the torch probe subprocess.

Failure modes 1 (wheel lacks the device's gfx), 3 (override names a gfx the wheel lacks),
6 (CUDA/CPU torch shadowing ROCm) and 12 (NumPy 2 beside a NumPy-1 torch).
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from greta_install.doctor.facts import Facts
from greta_install.doctor.gfx import (
    SIBLING_OVERRIDES,
    UNOFFICIAL_OVERRIDES,
    base_arch,
    override_to_gfx,
    wheel_archs,
)
from greta_install.doctor.model import Finding, fail, ok, skip, warn

from ._common import (
    AMD_TARGETS,
    GPU_TARGETS,
    SNAPSHOT_SKIP,
    as_dict,
    dict_list,
    first_line,
    install_fix,
    lock_pin,
    pip_install_line,
    primary_gpu,
    probe_failure,
    probe_missing,
    section_of,
    str_list,
)

OVERRIDE = "HSA_OVERRIDE_GFX_VERSION"
VISIBILITY_VARS = ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
NUMPY1_MARKERS = (
    "_ARRAY_API not found",
    "compiled using NumPy 1.x",
    "Numpy is not available",
    "numpy.core.multiarray failed to import",
)
SMOKE = "python -c 'import torch; print(torch.ones(1, device=\"cuda\") + 1)'"


def _torch(facts: Facts) -> dict[str, Any]:
    """The probe's torch section with every field coerced to the shape the checks expect
    (the probe may be an older or newer version, or its output damaged)."""
    data = dict(section_of(facts.torch_probe, "torch"))
    data["devices"] = dict_list(data.get("devices"))
    data["arch_list"] = str_list(data.get("arch_list"))
    data["import_warnings"] = str_list(data.get("import_warnings"))
    data["smoke"] = as_dict(data.get("smoke"))
    data["numpy_interop"] = as_dict(data.get("numpy_interop"))
    for key in ("version", "hip", "cuda"):
        if data.get(key) is not None:
            data[key] = str(data[key])
    try:
        data["device_count"] = int(data.get("device_count") or 0)
    except (TypeError, ValueError):
        data["device_count"] = len(data["devices"])
    return data


def _build(torch: dict[str, Any]) -> str:
    if torch.get("hip"):
        return f"ROCm {torch['hip']} build"
    if torch.get("cuda"):
        return f"CUDA {torch['cuda']} build"
    return "CPU build"


def _reinstall_torch(facts: Facts) -> str:
    """`greta install`, plus the pip line when the lock says which torch and index."""
    fix = install_fix(facts)
    pin = lock_pin(facts, "torch")
    if pin is not None and pin.version:
        index = pin.index
        line = pip_install_line([("torch", pin.version)], force=True)
        if index:
            line += f" --index-url {index}"
        fix += f"\nor: {line}"
    return fix


def _native_arch(facts: Facts, torch: dict[str, Any]) -> str | None:
    gpu = primary_gpu(facts)
    if gpu is not None and gpu.arch:
        return base_arch(gpu.arch)
    for device in torch.get("devices") or []:
        if device.get("arch"):
            return base_arch(device["arch"])
        if device.get("capability") and not torch.get("hip"):
            major, _, minor = str(device["capability"]).partition(".")
            return f"sm_{major}{minor}"
    return None


def check_import(facts: Facts) -> Finding:
    if not facts.live:
        return skip(SNAPSHOT_SKIP)
    probe = facts.torch_probe
    if probe is None or probe.outcome == "not_run":
        return skip("the torch probe was not run")
    if probe.outcome != "ok":
        gpu = primary_gpu(facts)
        arch = base_arch(gpu.arch) if gpu is not None else None
        if facts.env.get(OVERRIDE) and arch in UNOFFICIAL_OVERRIDES:
            fix = f"unset {OVERRIDE}   # the override is reported to hang on {arch}; then: greta doctor"
        elif probe.outcome == "timeout":
            longer = int((probe.timeout_s or 60) * 4)
            fix = f"greta doctor --probe-timeout {longer}   # if torch is only slow; {SMOKE} shows where it stops"
        else:
            fix = f"python -X faulthandler -c 'import torch'   # shows where it crashes; then: {install_fix(facts)}"
        return probe_failure(probe, "torch", fix)
    if not isinstance(probe.data.get("torch"), dict):
        return fail("the torch probe returned no torch section", install_fix(facts))
    torch = _torch(facts)
    if torch.get("missing"):
        if facts.target:
            return warn("torch is not installed", install_fix(facts))
        return skip("torch is not installed")
    if torch.get("error"):
        error = str(torch["error"])
        fix = _reinstall_torch(facts)
        if any(m in error for m in NUMPY1_MARKERS):
            fix = "pip install 'numpy<2'   # this torch was built against NumPy 1.x\nor: " + fix
        return fail(f"import torch fails: {first_line(error)}", fix, error=error)
    return ok(
        f"torch {torch.get('version')} imports ({_build(torch)})", version=torch.get("version")
    )


def _vendor_seen(facts: Facts, target: str) -> bool | None:
    """Whether detection saw a GPU of the target's vendor; None without a detection."""
    det = facts.detection
    if det is None:
        return None
    vendor = "nvidia" if target == "cuda" else "amd"
    return any(g.vendor == vendor for g in det.gpus)


def _what_needs(facts: Facts, target: str) -> str:
    """The claim the finding makes: only what detection saw, else what was asked for."""
    kind = "an NVIDIA GPU" if target == "cuda" else f"an AMD GPU ({target})"
    seen = _vendor_seen(facts, target)
    if seen:
        return f"{kind} is present"
    asked = "--target" if facts.target_source == "option" else "the target"
    if seen is None:
        return f"{asked} {target} needs a {'CUDA' if target == 'cuda' else 'ROCm'} build of torch"
    return (
        f"{asked} {target} needs a {'CUDA' if target == 'cuda' else 'ROCm'} build of torch "
        f"(detection found no {'NVIDIA' if target == 'cuda' else 'AMD'} GPU on this machine)"
    )


def _no_such_gpu_note(facts: Facts, target: str) -> str:
    if _vendor_seen(facts, target) is not False:
        return ""
    det = facts.detection
    here = det.target if det is not None else "cpu"
    return f"\nor, for this machine as detected: greta install --target {here}"


def check_build(facts: Facts) -> Finding:
    if missing := probe_missing(facts, facts.torch_probe, "torch"):
        return missing
    torch = _torch(facts)
    version = torch.get("version")
    target = facts.target
    if target is None:
        return skip(f"torch {version} ({_build(torch)}); no target to compare with")
    wrong = (target in AMD_TARGETS and not torch.get("hip")) or (
        target == "cuda" and not torch.get("cuda")
    )
    if wrong:
        return fail(
            f"{_what_needs(facts, target)} but torch {version} is a {_build(torch)}"
            + (
                ": torch.version.hip is None, so a CUDA or CPU wheel shadows the ROCm one"
                if target in AMD_TARGETS
                else ""
            ),
            _reinstall_torch(facts) + _no_such_gpu_note(facts, target),
            version=version,
            cuda=torch.get("cuda"),
            hip=torch.get("hip"),
        )
    return ok(f"torch {version} is a {_build(torch)}, right for target {target}", version=version)


def _arch_fix(facts: Facts, native: str, archs: set[str]) -> str:
    sibling = SIBLING_OVERRIDES.get(native)
    if sibling and override_to_gfx(sibling) in archs:
        return (
            f"export {OVERRIDE}={sibling}   # runs {native} on {override_to_gfx(sibling)} kernels"
        )
    return install_fix(facts) + f"   # a torch wheel built with {native} kernels"


def check_arch(facts: Facts) -> Finding:
    if missing := probe_missing(facts, facts.torch_probe, "torch"):
        return missing
    torch = _torch(facts)
    archs = wheel_archs(torch.get("arch_list") or [])
    if not torch.get("hip") and not torch.get("cuda"):
        return skip("CPU build of torch: no GPU kernels to match")
    if not archs:
        return skip("torch reports no arch list (it sees no GPU; see torch.gpu)")
    native = _native_arch(facts, torch)
    if native is None:
        return skip("the device's arch is unknown")
    details = {"arch": native, "arch_list": sorted(archs)}
    if torch.get("hip"):
        override = facts.env.get(OVERRIDE)
        effective = override_to_gfx(override) if override else None
        if override and effective:
            if effective in archs:
                return ok(
                    f"{native} runs as {effective} ({OVERRIDE}={override}); the wheel carries it",
                    **details,
                )
            return skip(f"{OVERRIDE}={override} decides the kernels (see torch.override)")
        if native in archs:
            return ok(f"torch carries kernels for {native}", **details)
        return fail(
            f"torch {torch.get('version')} carries kernels for {', '.join(sorted(archs))} but not "
            f"{native}: GPU work fails with 'HIP error: invalid device function'",
            _arch_fix(facts, native, archs),
            **details,
        )
    if native in archs:
        return ok(f"torch carries kernels for {native}", **details)
    match = re.match(r"sm_(\d+)$", native)
    ptx = [a for a in archs if a.startswith("compute_")]
    if match and any(
        int(a.split("_")[1]) <= int(match.group(1)) for a in ptx if a.split("_")[1].isdigit()
    ):
        return ok(f"torch has no {native} kernels but PTX it can JIT-compile for them", **details)
    return fail(
        f"torch {torch.get('version')} carries kernels for {', '.join(sorted(archs))} but not {native}",
        _reinstall_torch(facts),
        **details,
    )


def check_override(facts: Facts) -> Finding:
    if not facts.live:
        return skip(SNAPSHOT_SKIP)
    value = facts.env.get(OVERRIDE)
    if value is None:
        return ok(f"{OVERRIDE} is not set")
    if missing := probe_missing(facts, facts.torch_probe, "torch"):
        return missing
    gfx = override_to_gfx(value)
    if gfx is None:
        return skip(f"{OVERRIDE}={value!r} is malformed (see gpu.override)")
    torch = _torch(facts)
    if not torch.get("hip"):
        return skip(f"torch {torch.get('version')} is not a ROCm build (see torch.build)")
    archs = wheel_archs(torch.get("arch_list") or [])
    if not archs:
        return skip("torch reports no arch list (it sees no GPU; see torch.gpu)")
    details = {"override": value, "gfx": gfx, "arch_list": sorted(archs)}
    if gfx in archs:
        return ok(f"{OVERRIDE}={value} ({gfx}) is among the wheel's archs", **details)
    native = _native_arch(facts, {})  # not torch's device arch: the override renames it
    if native and native in archs:
        fix = f"unset {OVERRIDE}   # torch carries {native} natively"
    elif (
        native
        and SIBLING_OVERRIDES.get(native)
        and override_to_gfx(SIBLING_OVERRIDES[native]) in archs
    ):
        fix = f"export {OVERRIDE}={SIBLING_OVERRIDES[native]}"
    else:
        fix = _reinstall_torch(facts)
    return fail(
        f"{OVERRIDE}={value} asks for {gfx} kernels, which torch {torch.get('version')} lacks "
        f"(it has {', '.join(sorted(archs))})",
        fix,
        **details,
    )


def _hidden_by_env(facts: Facts) -> dict[str, str]:
    return {k: facts.env[k] for k in VISIBILITY_VARS if k in facts.env}


def check_gpu(facts: Facts) -> Finding:
    if missing := probe_missing(facts, facts.torch_probe, "torch"):
        return missing
    torch = _torch(facts)
    target = facts.target
    count = int(torch.get("device_count") or 0)
    devices = torch.get("devices") or []
    names = ", ".join(str(d.get("name")) for d in devices if d.get("name"))
    if target not in GPU_TARGETS:
        if torch.get("cuda_available"):
            return ok(f"target {target or 'unknown'}; torch sees {count} GPU(s): {names}")
        return ok(f"target {target or 'unknown'}: torch sees no GPU and runs on the CPU")
    if not torch.get("cuda_available") or count == 0:
        env = _hidden_by_env(facts)
        why = torch.get("cuda_error")
        if not torch.get("hip") and not torch.get("cuda"):
            fix = _reinstall_torch(facts) + _no_such_gpu_note(facts, target)
        elif env:
            fix = "unset " + " ".join(env) + "   # they hide the GPU from torch"
        elif target in AMD_TARGETS:
            fix = "sudo usermod -aG render,video $USER   # then log in again; see devices.kfd and devices.render"
        else:
            fix = "nvidia-smi   # must list the GPU; if it fails, reinstall the NVIDIA driver and reboot"
        vendor = "NVIDIA" if target == "cuda" else "AMD"
        return fail(
            f"torch {torch.get('version')} ({_build(torch)}) sees no GPU"
            + (f" ({first_line(why)})" if why else "")
            + (
                f"; detection found no {vendor} GPU on this machine either"
                if _vendor_seen(facts, target) is False
                else ""
            )
            + (f"; set: {', '.join(f'{k}={v}' for k, v in env.items())}" if env else ""),
            fix,
            env=env,
        )
    smoke = torch.get("smoke") or {}
    if smoke and not smoke.get("ok"):
        error = str(smoke.get("error") or f"wrong result {smoke.get('value')}")
        native = _native_arch(facts, torch)
        archs = wheel_archs(torch.get("arch_list") or [])
        fix = (
            _arch_fix(facts, native, archs)
            if "invalid device function" in error and native
            else _reinstall_torch(facts)
        )
        return fail(
            f"torch sees {count} GPU(s) ({names}) but a test kernel failed: {first_line(error)}",
            fix,
        )
    return ok(
        f"torch sees {count} GPU(s): {names}; a test kernel ran", count=count, devices=devices
    )


def check_numpy(facts: Facts) -> Finding:
    if not facts.live:
        return skip(SNAPSHOT_SKIP)
    probe = facts.torch_probe
    if probe is None or probe.outcome != "ok":
        return skip("the torch probe did not complete (see torch.import)")
    numpy = section_of(probe, "numpy")
    torch = _torch(facts)
    if numpy.get("missing"):
        return skip("NumPy is not installed")
    if numpy.get("error"):
        return fail(
            f"import numpy fails: {first_line(numpy['error'])}",
            "pip install --force-reinstall numpy",
        )
    if torch.get("missing"):
        return skip("torch is not installed")
    version = str(numpy.get("version") or "?")
    interop = torch.get("numpy_interop") or {}
    texts = [str(torch.get("error") or ""), str(interop.get("error") or ""), probe.stderr_tail]
    texts += torch["import_warnings"]
    marker = next((m for t in texts for m in NUMPY1_MARKERS if m in t), None)
    major = version.split(".")[0]
    if marker and major.isdigit() and int(major) >= 2:
        return fail(
            f"NumPy {version} is installed beside a torch built against NumPy 1.x ({marker!r})",
            "pip install "
            + shlex.quote("numpy<2")
            + f"\nor: {install_fix(facts)}   # a torch built for NumPy 2",
            numpy=version,
            marker=marker,
        )
    if torch.get("error"):
        return skip("torch does not import (see torch.import)")
    if interop.get("ok") is False:
        return fail(
            f"torch.from_numpy round trip fails with NumPy {version}: {first_line(interop.get('error'))}",
            install_fix(facts),
            numpy=version,
        )
    return ok(f"NumPy {version} works with torch {torch.get('version')}", numpy=version)
