"""The NVIDIA -> AMD library mapping as this machine sees it (``greta backends``).

`probe()` is the imperative part (imports torch lazily, reads versions and switches);
`format_text()` and `summarize()` are pure functions over its JSON-able report.
`doctor_summary()` runs the probe in a subprocess so a crashing torch cannot take the
doctor down.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from typing import Any

from greta_core.arch import device_arch

SCHEMA = 1

# (env var, platforms it applies to, what it changes)
ENV_SWITCHES: tuple[tuple[str, str, str], ...] = (
    ("TORCH_BLAS_PREFER_HIPBLASLT", "rocm", "1: GEMMs prefer hipBLASLt, 0: rocBLAS"),
    ("TORCH_BLAS_PREFER_CUBLASLT", "cuda", "1: GEMMs prefer cuBLASLt over cuBLAS"),
    ("PYTORCH_TUNABLEOP_ENABLED", "cuda,rocm", "1: TunableOp times BLAS solutions per shape"),
    ("TORCH_ROCM_FA_PREFER_CK", "rocm", "1: SDPA flash uses CK instead of AOTriton"),
    ("TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL", "rocm", "1: AOTriton SDPA on unofficial GPUs"),
    ("MIOPEN_FIND_MODE", "rocm", "MIOpen kernel search: NORMAL, FAST, HYBRID..."),
    ("MIOPEN_USER_DB_PATH", "rocm", "where MIOpen keeps its tuning database"),
    ("CUBLAS_WORKSPACE_CONFIG", "cuda", "cuBLAS workspace (deterministic runs need one)"),
    ("NCCL_DEBUG", "cuda,rocm", "NCCL/RCCL logging"),
    ("GRETA_IMPL", "any", "force GretaCompute implementations: op=impl,op=impl"),
)


def dist_version(*names: str) -> str | None:
    """The installed version of the first of `names` that is installed, or None."""
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _safe(fn: Any, default: Any = None) -> Any:
    try:
        return fn()
    except Exception:  # a probe never raises: a missing API just reads as unknown
        return default


def _torch_libs(torch: Any, stem: str) -> list[str]:
    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    return sorted(f for f in _safe(lambda: os.listdir(lib), []) if f.startswith(stem))


def _enum_name(value: Any) -> str | None:
    return None if value is None else str(value).split(".")[-1]


def _platform(torch: Any) -> str:
    if getattr(torch.version, "hip", None):
        return "rocm"
    if getattr(torch.version, "cuda", None):
        return "cuda"
    return "cpu"


def _torch_section(torch: Any) -> dict[str, Any]:
    gpu = None
    if _safe(lambda: torch.cuda.is_available(), False):
        props = torch.cuda.get_device_properties(0)
        gpu = {
            "name": props.name,
            "arch": device_arch(0),
            "count": torch.cuda.device_count(),
        }
    return {
        "installed": True,
        "version": torch.__version__,
        "build": _platform(torch),
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "gpu": gpu,
    }


def _blas(torch: Any, build: str, gpu: bool) -> dict[str, Any]:
    preferred = _enum_name(_safe(lambda: torch.backends.cuda.preferred_blas_library()))
    default = _enum_name(_safe(lambda: torch._C._get_blas_default_backend()))
    if build == "rocm":
        libs = _torch_libs(torch, "libhipblaslt") + _torch_libs(torch, "librocblas")
        active = {"Cublas": "rocBLAS/hipBLAS", "Cublaslt": "hipBLASLt", "Ck": "CK"}.get(
            preferred or "", preferred
        )
        version = dist_version("rocm-sdk-libraries", "hipblaslt") or (
            f"bundled with ROCm {torch.version.hip}"
        )
    else:
        libs = []
        active = {"Cublas": "cuBLAS", "Cublaslt": "cuBLASLt"}.get(preferred or "", preferred)
        version = dist_version("nvidia-cublas-cu12", "nvidia-cublas-cu13", "nvidia-cublas")
    return {
        "id": "blas",
        "role": "GEMM",
        "nvidia": "cuBLAS / cuBLASLt",
        "amd": "rocBLAS / hipBLASLt",
        "via": "torch.matmul; torch.backends.cuda.preferred_blas_library()",
        "present": gpu and build in ("cuda", "rocm"),
        "active": active if gpu else None,
        "version": version if gpu else None,
        "detail": {"preferred": preferred, "default": default, "bundled_libs": libs},
    }


def _dnn(torch: Any, build: str, gpu: bool) -> dict[str, Any]:
    available = bool(_safe(lambda: torch.backends.cudnn.is_available(), False))
    version = _safe(lambda: torch.backends.cudnn.version())
    return {
        "id": "dnn",
        "role": "convolution, some norms/RNNs",
        "nvidia": "cuDNN",
        "amd": "MIOpen",
        "via": "F.conv2d etc.; torch.backends.cudnn.* drives MIOpen on ROCm",
        "present": available and gpu,
        "active": ("MIOpen" if build == "rocm" else "cuDNN") if available and gpu else None,
        "version": None if version is None else str(version),
        "detail": {
            "enabled": _safe(lambda: bool(torch.backends.cudnn.enabled)),
            "benchmark": _safe(lambda: bool(torch.backends.cudnn.benchmark)),
            "deterministic": _safe(lambda: bool(torch.backends.cudnn.deterministic)),
        },
    }


def _sdpa(torch: Any, build: str, gpu: bool) -> dict[str, Any]:
    cuda = torch.backends.cuda
    flash_built = bool(_safe(lambda: cuda.is_flash_attention_available(), False))
    ck = bool(_safe(lambda: cuda.is_ck_sdpa_available(), False))
    fa_pref = (
        _enum_name(_safe(lambda: cuda.preferred_rocm_fa_library())) if build == "rocm" else None
    )
    if build == "rocm":
        active = ("CK" if fa_pref == "Ck" else "AOTriton") if flash_built else None
    else:
        active = "FlashAttention-2 / cuDNN" if flash_built else None
    return {
        "id": "attention",
        "role": "fused attention",
        "nvidia": "FlashAttention / cuDNN SDPA",
        "amd": "AOTriton / CK",
        "via": "F.scaled_dot_product_attention (sdpa_kernel picks the backend)",
        "present": flash_built and gpu,
        "active": active if gpu else None,
        "version": None,
        "detail": {
            "flash_built": flash_built,
            "ck_available": ck,
            "preferred_rocm_fa_library": fa_pref,
            "flash_sdp_enabled": _safe(lambda: cuda.flash_sdp_enabled()),
            "mem_efficient_sdp_enabled": _safe(lambda: cuda.mem_efficient_sdp_enabled()),
            "cudnn_sdp_enabled": _safe(lambda: cuda.cudnn_sdp_enabled()),
            "math_sdp_enabled": _safe(lambda: cuda.math_sdp_enabled()),
        },
    }


def _onnxruntime_providers() -> list[str]:
    if not _has_module("onnxruntime"):
        return []
    import onnxruntime

    return list(_safe(lambda: onnxruntime.get_available_providers(), []))


def _graph_compiler(build: str, gpu: bool) -> dict[str, Any]:
    providers = _onnxruntime_providers()
    trt = _has_module("torch_tensorrt")
    mgx = _has_module("torch_migraphx")
    detail = {
        "torch_tensorrt": dist_version("torch-tensorrt", "torch_tensorrt") if trt else None,
        "tensorrt": dist_version("tensorrt", "tensorrt-cu12") if _has_module("tensorrt") else None,
        "torch_migraphx": dist_version("torch-migraphx", "torch_migraphx") if mgx else None,
        "migraphx": "importable" if _has_module("migraphx") else None,
        "onnxruntime": dist_version("onnxruntime-rocm", "onnxruntime-gpu", "onnxruntime")
        if providers
        else None,
        "onnxruntime_providers": providers,
    }
    if build == "rocm":
        present = mgx or "MIGraphXExecutionProvider" in providers
        active = (
            "MIGraphX (torch_migraphx)" if mgx else ("MIGraphX (ONNX Runtime)" if present else None)
        )
        version = detail["torch_migraphx"]
    else:
        present = trt or "TensorrtExecutionProvider" in providers
        active = (
            "TensorRT (torch_tensorrt)" if trt else ("TensorRT (ONNX Runtime)" if present else None)
        )
        version = detail["torch_tensorrt"]
    return {
        "id": "graph_compiler",
        "role": "whole-graph inference compiler",
        "nvidia": "TensorRT",
        "amd": "MIGraphX",
        "via": "greta_core.compile (torch.compile backend), ONNX Runtime execution provider",
        "present": bool(present and gpu),
        "active": active if gpu else None,
        "version": version,
        "detail": detail,
    }


def _graphs(torch: Any, build: str, gpu: bool) -> dict[str, Any]:
    has_api = hasattr(torch.cuda, "CUDAGraph")
    return {
        "id": "graphs",
        "role": "launch replay",
        "nvidia": "CUDA Graphs",
        "amd": "HIP Graphs",
        "via": "greta_core.graph.GretaGraph (torch.cuda.CUDAGraph, same API on ROCm)",
        "present": has_api and gpu,
        "active": ("HIP Graphs" if build == "rocm" else "CUDA Graphs") if has_api and gpu else None,
        "version": torch.version.hip or torch.version.cuda if gpu else None,
        "detail": {"api": has_api},
    }


def _collectives(torch: Any, build: str, gpu: bool) -> dict[str, Any]:
    available = bool(_safe(lambda: torch.distributed.is_nccl_available(), False))
    version = _safe(lambda: ".".join(map(str, torch.cuda.nccl.version()))) if available else None
    return {
        "id": "collectives",
        "role": "multi-GPU collectives",
        "nvidia": "NCCL",
        "amd": "RCCL",
        "via": "torch.distributed backend 'nccl'",
        "present": available,
        "active": ("RCCL" if build == "rocm" else "NCCL") if available else None,
        "version": version,
        "detail": {},
    }


def _triton(torch: Any, build: str, gpu: bool) -> dict[str, Any]:
    version = dist_version("triton", "triton-rocm", "pytorch-triton-rocm", "pytorch-triton")
    return {
        "id": "triton",
        "role": "GRETA kernels",
        "nvidia": "Triton (PTX)",
        "amd": "Triton (AMDGCN)",
        "via": "torch.ops.greta.* / greta_core.compute",
        "present": version is not None,
        "active": ("Triton GPU" if gpu else "Triton interpreter / CPU reference")
        if version
        else None,
        "version": version,
        "detail": {},
    }


def _scenarios(device: str, dtype: str) -> list[tuple[str, str, Any]]:
    from greta_core.compute._probes import CallInfo

    def info(*shapes: tuple[int, ...], extra: tuple[Any, ...] = ()) -> Any:
        return CallInfo(device, dtype, shapes, extra)

    return [
        ("matmul", "", info((64, 128), (128, 256), ())),
        ("attention", "prefill", info((1, 8, 128, 64), (1, 2, 128, 64), (1, 2, 128, 64),
                                      extra=(True, False, False))),
        ("attention", "decode, KV lengths", info((4, 8, 1, 64), (4, 2, 256, 64),
                                                 (4, 2, 256, 64), extra=(True, False, True))),
        ("rms_norm", "", info((4, 512), (512,))),
        ("layer_norm", "", info((4, 512), (512,), (512,))),
        ("softmax", "", info((4, 512))),
        ("rope", "", info((1, 16, 8, 64), (16, 32), (16, 32))),
        ("kv_cache_append", "", info((4, 2, 256, 64), (4, 2, 256, 64), (4, 2, 1, 64),
                                     (4, 2, 1, 64), (4,))),
        ("conv2d", "", info((1, 16, 32, 32), (32, 16, 3, 3), (32,))),
    ]  # fmt: skip


def _operations(platform: str) -> tuple[str, str, list[dict[str, Any]]]:
    from greta_core import compute
    from greta_core.compute.dispatch import candidates, select
    from greta_core.compute.forcing import forced

    device = compute.default_device()
    dtype = str(compute.default_dtype(device)).replace("torch.", "")
    rows = []
    for op, label, info in _scenarios(device, dtype):
        cands = candidates(op, info)
        try:
            chosen, error = select(op, info).name, None
        except Exception as exc:  # forced-but-unavailable shows here, not as a crash
            chosen, error = None, str(exc)
        force = _safe(lambda op=op: forced(op))
        rows.append(
            {
                "op": op,
                "case": label,
                "selected": chosen,
                "forced": None if not force else {"impl": force[0], "by": force[1]},
                "error": error,
                "candidates": [
                    {
                        "name": impl.name,
                        "kind": impl.kind,
                        "library": impl.library_on(platform),
                        "available": why is None,
                        "reason": why,
                    }
                    for impl, why in cands
                ],
            }
        )
    return device, dtype, rows


def _switches(torch: Any | None, environ: dict[str, str]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = [
        {
            "name": name,
            "kind": "env",
            "applies_to": where,
            "value": environ.get(name),
            "effect": what,
        }
        for name, where, what in ENV_SWITCHES
    ]
    rows += [
        {"name": k, "kind": "env", "applies_to": "any", "value": v, "effect": "force one op"}
        for k, v in sorted(environ.items())
        if k.startswith("GRETA_IMPL_")
    ]
    if torch is None:
        return rows
    cuda, cudnn = torch.backends.cuda, torch.backends.cudnn
    api = [
        ("torch.backends.cuda.preferred_blas_library()", "cuda,rocm",
         lambda: _enum_name(cuda.preferred_blas_library()), "cuBLAS vs cuBLASLt / hipBLASLt vs rocBLAS vs CK"),
        ("torch.backends.cuda.preferred_rocm_fa_library()", "rocm",
         lambda: _enum_name(cuda.preferred_rocm_fa_library()), "AOTriton vs CK flash attention"),
        ("torch.backends.cuda.matmul.allow_tf32", "cuda", lambda: cuda.matmul.allow_tf32,
         "TF32 in float32 GEMMs"),
        ("torch.backends.cudnn.enabled", "cuda,rocm", lambda: cudnn.enabled, "use cuDNN/MIOpen at all"),
        ("torch.backends.cudnn.benchmark", "cuda,rocm", lambda: cudnn.benchmark,
         "autotune conv algorithms (MIOpen find)"),
        ("torch.backends.cudnn.deterministic", "cuda,rocm", lambda: cudnn.deterministic,
         "deterministic conv algorithms only"),
        ("torch.backends.cuda.flash_sdp_enabled()", "cuda,rocm", cuda.flash_sdp_enabled,
         "SDPA may use flash"),
        ("torch.backends.cuda.mem_efficient_sdp_enabled()", "cuda,rocm",
         cuda.mem_efficient_sdp_enabled, "SDPA may use memory-efficient"),
        ("torch.backends.cuda.cudnn_sdp_enabled()", "cuda", cuda.cudnn_sdp_enabled,
         "SDPA may use cuDNN attention"),
        ("torch.backends.cuda.math_sdp_enabled()", "cuda,rocm", cuda.math_sdp_enabled,
         "SDPA may use the math fallback"),
    ]  # fmt: skip
    rows += [
        {"name": n, "kind": "api", "applies_to": w, "value": _safe(f), "effect": e}
        for n, w, f, e in api
    ]
    return rows


def probe(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """The whole report as JSON-able data. Never raises for a missing torch or GPU."""
    environ = dict(os.environ if environ is None else environ)
    report: dict[str, Any] = {"schema": SCHEMA, "python": sys.version.split()[0]}
    try:
        import torch
    except Exception as exc:  # ImportError, or a broken install raising anything
        report.update(
            torch={
                "installed": False,
                "error": f"torch not installed ({exc.__class__.__name__}: {exc})",
            },
            platform="cpu",
            libraries=[],
            operations=[],
            switches=_switches(None, environ),
        )
        return report
    section = _torch_section(torch)
    gpu = section["gpu"] is not None
    build = section["build"]
    platform = build if gpu else "cpu"
    libraries = [
        fn(torch, build, gpu) for fn in (_blas, _dnn, _sdpa, _graphs, _collectives, _triton)
    ]
    libraries.insert(3, _graph_compiler(build, gpu))
    try:
        device, dtype, ops = _operations(platform)
        ops_error = None
    except Exception as exc:
        device, dtype, ops, ops_error = None, None, [], f"{exc.__class__.__name__}: {exc}"
    report.update(
        torch=section,
        platform=platform,
        device=device,
        dtype=dtype,
        libraries=libraries,
        operations=ops,
        operations_error=ops_error,
        compile_backend=_safe(_compile_choice),
        switches=_switches(torch, environ),
    )
    return report


def _compile_choice() -> str:
    from greta_core.compile import choose_backend

    return choose_backend()[0]


# --- pure formatting ---------------------------------------------------------------------


def _yn(value: Any) -> str:
    return {True: "yes", False: "no", None: "-"}.get(value, str(value))


def format_text(report: dict[str, Any]) -> str:
    torch = report.get("torch", {})
    lines = []
    if not torch.get("installed"):
        lines.append(f"torch: {torch.get('error', 'torch not installed')}")
        lines.append("GretaCompute needs torch; nothing else to report.")
        return "\n".join(lines)
    gpu = torch.get("gpu")
    lines.append(
        f"torch {torch['version']} ({torch['build']} build), "
        + (f"GPU: {gpu['name']} [{gpu['arch']}] x{gpu['count']}" if gpu else "no GPU visible")
    )
    lines.append("")
    lines.append(f"{'NVIDIA':28} {'AMD':22} {'present':8} {'in use':26} version")
    for lib in report.get("libraries", []):
        lines.append(
            f"{lib['nvidia']:28} {lib['amd']:22} {_yn(lib['present']):8} "
            f"{lib['active'] or '-':26} {lib['version'] or '-'}"
        )
    lines.append("")
    lines.append(f"operations on {report.get('device')} / {report.get('dtype')}:")
    for row in report.get("operations", []):
        name = row["op"] + (f" ({row['case']})" if row["case"] else "")
        chosen = row["selected"] or f"ERROR: {row['error']}"
        forced = f"  [forced by {row['forced']['by']}]" if row.get("forced") else ""
        lines.append(f"  {name:32} -> {chosen}{forced}")
        for cand in row["candidates"]:
            mark = "ok " if cand["available"] else "-- "
            why = "" if cand["available"] else f": {cand['reason']}"
            lines.append(f"      {mark}{cand['name']:15} {cand['library']}{why}")
    if report.get("operations_error"):
        lines.append(f"  (could not evaluate: {report['operations_error']})")
    lines.append("")
    lines.append(f"compile path: {report.get('compile_backend') or '-'}")
    lines.append("switches (set ones first):")
    switches = sorted(report.get("switches", []), key=lambda s: s["value"] in (None, ""))
    for sw in switches:
        lines.append(f"  {sw['name']:50} = {sw['value']!s:10} ({sw['applies_to']}) {sw['effect']}")
    return "\n".join(lines)


def summarize(report: dict[str, Any]) -> list[dict[str, str]]:
    """Doctor checks (id, status, finding, fix) from a report."""
    torch = report.get("torch", {})
    if not torch.get("installed"):
        return [
            {
                "id": "backends.torch",
                "status": "skip",
                "finding": torch.get("error", "torch not installed"),
                "fix": "greta install",
            }
        ]
    checks = []
    gpu = torch.get("gpu") is not None
    for lib in report.get("libraries", []):
        if lib["id"] == "graph_compiler" and not lib["present"]:
            status = "skip"
        elif gpu and lib["id"] in ("blas", "attention", "graphs") and not lib["present"]:
            status = "warn"
        else:
            status = "ok" if lib["present"] or not gpu else "skip"
        finding = f"{lib['nvidia']} -> {lib['amd']}: " + (
            f"{lib['active']} {lib['version'] or ''}".strip() if lib["present"] else "absent"
        )
        fix = ""
        if lib["id"] == "graph_compiler" and not lib["present"]:
            fix = (
                "optional: pip install torch_migraphx (ROCm) or torch-tensorrt (CUDA); "
                "greta_core.compile falls back to torch.compile"
            )
        checks.append(
            {"id": f"backends.{lib['id']}", "status": status, "finding": finding, "fix": fix}
        )
    for row in report.get("operations", []):
        if row["error"]:
            checks.append(
                {
                    "id": f"backends.op.{row['op']}",
                    "status": "fail",
                    "finding": row["error"],
                    "fix": "unset the GRETA_IMPL* variable or force an available implementation",
                }
            )
    if report.get("operations_error"):
        checks.append(
            {
                "id": "backends.ops",
                "status": "warn",
                "finding": report["operations_error"],
                "fix": "",
            }
        )
    return checks


def doctor_summary(timeout: float = 120.0) -> list[dict[str, str]]:
    """Backend checks for ``greta doctor``; the probe runs in a subprocess with a timeout."""
    from greta_install.commandline import NEUTRAL_CWD, greta_child

    cmd = greta_child("greta_core.backends")
    try:
        done = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=NEUTRAL_CWD,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return [_probe_failed(f"the backend probe took longer than {timeout:.0f} s")]
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return [_probe_failed(f"the backend probe exited with {done.returncode}: {tail[0]}")]
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        return [_probe_failed("the backend probe printed something that is not JSON")]
    return summarize(report)


def _probe_failed(finding: str) -> dict[str, str]:
    return {
        "id": "backends.probe",
        "status": "fail",
        "finding": finding,
        "fix": "run `greta backends` to see the error; `greta doctor` checks the torch install",
    }


if __name__ == "__main__":
    print(json.dumps(probe(), indent=2, default=str))
