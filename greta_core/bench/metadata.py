"""Where and with what a bench ran: GPU, driver, library versions, git commit, date.

No host name and no local path is recorded: result files are meant to be shared.
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from greta_core.arch import device_arch
from greta_core.backends import dist_version

# Distribution names that provide each import package (ROCm builds rename triton).
_DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "torch": ("torch",),
    "triton": ("triton", "triton-rocm", "pytorch-triton-rocm", "pytorch-triton"),
    "jax": ("jax",),
    "jaxlib": ("jaxlib",),
    "jax_triton": ("jax-triton", "jax_triton"),
    "numpy": ("numpy",),
    "matplotlib": ("matplotlib",),
}


def package_versions() -> dict[str, str | None]:
    """Installed versions, read from package metadata (importing jax here would be slow)."""
    return {key: dist_version(*names) for key, names in _DISTRIBUTIONS.items()}


def _run(
    cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 10
) -> str | None:
    if not shutil.which(cmd[0]):
        return None
    try:
        proc = subprocess.run(
            cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def git_commit(repo: Path | None = None) -> dict[str, Any]:
    """Commit of the GRETA checkout the code runs from, whether it had local changes, and
    the git tree of the files as they are (``tree``: equal to ``git rev-parse C^{tree}`` of
    the commit C whose files ran, whatever the checkout's own HEAD says; a copied working
    tree, as the lent GPU machines get, keeps a stale HEAD)."""
    repo = repo or Path(__file__).resolve().parents[2]
    commit = _run(["git", "rev-parse", "HEAD"], cwd=repo)
    if commit is None:
        return {"commit": None, "dirty": None, "tree": None}
    status = _run(["git", "status", "--porcelain"], cwd=repo)
    tree = _run(["git", "rev-parse", "HEAD^{tree}"], cwd=repo) if status == "" else _tree(repo)
    dirty = (
        None if status is None else any(not line.startswith("??") for line in status.splitlines())
    )
    return {"commit": commit, "dirty": dirty, "tree": tree}


def _tree(repo: Path) -> str | None:
    """The git tree of the working files (tracked or not, .gitignore honoured), through a
    throwaway index: the checkout's own index and HEAD are left as they are."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "GIT_INDEX_FILE": str(Path(tmp) / "index")}
        if _run(["git", "add", "-A"], repo, env, timeout=60) is None:
            return None
        return _run(["git", "write-tree"], repo, env)


def header(
    preset: str, device: str, script: str, argv: list[str] | None, out: Path
) -> dict[str, Any]:
    """The fields a bench script's result file starts with: ``metadata`` and the
    ``command`` (`argv` None: this process's own arguments)."""
    args = sys.argv[1:] if argv is None else argv
    return {"metadata": collect(preset, device), "command": command_line(script, args, out)}


def command_line(script: str, argv: list[str], out: Path) -> str:
    """The command a result came from, with `out`'s folder shown as ``<out>``: a committed
    result names no path of the machine it ran on."""
    args = [a.replace(str(out.parent), "<out>") if out.is_absolute() else a for a in argv]
    return " ".join(["python", script, *args])


def parse_nvidia_driver(text: str) -> str | None:
    """Driver version from `nvidia-smi --query-gpu=driver_version` or /proc/driver/nvidia/version."""
    match = re.search(r"(\d+\.\d+(?:\.\d+)?)", text or "")
    return match.group(1) if match else None


def driver_version(is_hip: bool) -> str | None:
    if is_hip:
        amdgpu = Path("/sys/module/amdgpu/version")
        if amdgpu.is_file():
            return amdgpu.read_text().strip() or None
        rocm = Path("/opt/rocm/.info/version")
        return f"rocm {rocm.read_text().strip()}" if rocm.is_file() else None
    out = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    if out:
        return parse_nvidia_driver(out.splitlines()[0])
    proc = Path("/proc/driver/nvidia/version")
    return parse_nvidia_driver(proc.read_text()) if proc.is_file() else None


def device_info(device: str) -> dict[str, Any]:
    """GPU name, arch, memory and cache sizes through torch; CPU description otherwise."""
    import torch

    info: dict[str, Any] = {
        "device": device,
        "cuda_version": getattr(torch.version, "cuda", None),
        "hip_version": getattr(torch.version, "hip", None),
    }
    if device == "cpu":
        info.update(gpu_name=None, cpu=platform.processor() or platform.machine())
        info["driver"] = None
        return info
    props = torch.cuda.get_device_properties(0)
    is_hip = bool(info["hip_version"])
    info.update(
        gpu_name=torch.cuda.get_device_name(0),
        gpu_count=torch.cuda.device_count(),
        arch=device_arch(0),
        multiprocessors=props.multi_processor_count,
        memory_gib=round(props.total_memory / 2**30, 1),
        l2_cache_mb=round(getattr(props, "L2_cache_size", 0) / 1e6, 1) or None,
        driver=driver_version(is_hip),
    )
    try:
        info["cudnn_version"] = torch.backends.cudnn.version()
    except Exception:  # cudnn absent from some builds
        info["cudnn_version"] = None
    return info


def collect(preset: str, device: str) -> dict[str, Any]:
    """Every metadata field the result files carry."""
    meta: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "preset": preset,
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "versions": package_versions(),
    }
    meta.update(git_commit())
    meta.update(device_info(device))
    return meta
