"""Every doctor check, in report order. Each is a pure function Facts -> Finding."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from greta_install.doctor.facts import Facts
from greta_install.doctor.model import Finding

from . import (
    backends_checks,
    container,
    cuda_checks,
    devices,
    env_fixes,
    gpu,
    jax_checks,
    lock_checks,
    multi_gpu,
    python,
    torch_checks,
    triton_checks,
)


@dataclass(frozen=True)
class Check:
    id: str
    title: str
    func: Callable[[Facts], Finding]
    failure_mode: int | None = None  # number in DESIGN.md's list of recurring failures


CHECKS: tuple[Check, ...] = (
    Check("python.version", "Python version covered by the lock", python.check_version),
    Check("python.venv", "virtual environment", python.check_venv),
    Check("python.bytecode", "bytecode for torch, triton, jax", python.check_bytecode),
    Check("container.detect", "container detection", container.check_detect),
    Check("container.devices", "GPU devices passed into the container", container.check_devices, 5),
    Check("gpu.detect", "GPU detection and target", gpu.check_detect),
    Check("gpu.sriov", "SR-IOV host without usable compute", gpu.check_sriov),
    Check("gpu.unofficial", "unofficial ROCm targets (APUs)", gpu.check_unofficial, 2),
    Check("gpu.override", "HSA_OVERRIDE_GFX_VERSION for this GPU", gpu.check_override, 3),
    Check("gpu.multi", "iGPU and dGPU both visible", gpu.check_multi, 9),
    Check("gpu.apu_memory", "APU VRAM carve-out and GTT", gpu.check_apu_memory, 10),
    Check("devices.kfd", "/dev/kfd access", devices.check_kfd, 4),
    Check("devices.render", "/dev/dri/renderD* access", devices.check_render, 4),
    Check("torch.import", "torch imports", torch_checks.check_import),
    Check("torch.build", "torch build matches the GPU vendor", torch_checks.check_build, 6),
    Check("torch.arch", "torch wheel carries the device's arch", torch_checks.check_arch, 1),
    Check(
        "torch.override", "override names an arch the wheel carries", torch_checks.check_override, 3
    ),
    Check("torch.gpu", "GPU visible to torch", torch_checks.check_gpu),
    Check("numpy.torch", "NumPy works with torch", torch_checks.check_numpy, 12),
    Check("triton.providers", "one distribution provides triton", triton_checks.check_providers, 8),
    Check("triton.version", "triton version torch requires", triton_checks.check_version, 8),
    Check(
        "triton.fast_launch",
        "GRETA's fast launch supports this Triton",
        triton_checks.check_fast_launch,
    ),
    Check("jax.import", "jax imports", jax_checks.check_import),
    Check(
        "jax.versions", "jax, jaxlib, plugin and pjrt versions agree", jax_checks.check_versions, 11
    ),
    Check("jax.gpu", "GPU visible to jax (plugin loads)", jax_checks.check_gpu, 11),
    Check(
        "cuda.ptxas",
        "the ptxas XLA finds is not older than the NVIDIA wheels' one",
        cuda_checks.check_ptxas,
    ),
    Check("lock.installed", "installed versions match the lock", lock_checks.check_installed),
    Check("lock.env", "the lock's environment variables are in effect", lock_checks.check_env),
    Check("env.fixes", "persisted environment fixes are readable", env_fixes.check_env_fixes),
    Check("lock.index", "locked versions exist on their index", lock_checks.check_index, 7),
    Check("kernels.wheel", "GRETA kernel wheel for the arch", lock_checks.check_kernels),
    Check(
        "multi_gpu.visible_devices",
        "visible-devices variables agree",
        multi_gpu.check_visible_devices,
    ),
    Check("multi_gpu.iommu", "IOMMU mode on the kernel command line", multi_gpu.check_iommu),
    Check("multi_gpu.acs", "PCIe ACS off above the GPUs", multi_gpu.check_acs),
    Check("multi_gpu.links", "XGMI/NVLink between the GPUs", multi_gpu.check_links),
    Check(
        "multi_gpu.fine_grain",
        "HSA_FORCE_FINE_GRAIN_PCIE for PCIe links",
        multi_gpu.check_fine_grain,
    ),
    Check("multi_gpu.p2p", "peer-to-peer settings", multi_gpu.check_p2p),
    Check("multi_gpu.numa_balancing", "NUMA auto-balancing off", multi_gpu.check_numa_balancing),
    Check("multi_gpu.numa_placement", "GPUs and NUMA nodes", multi_gpu.check_numa_placement),
    Check("backends.summary", "NVIDIA -> AMD library mapping", backends_checks.check_backends),
)
