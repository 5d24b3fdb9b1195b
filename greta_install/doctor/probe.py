"""Framework probe: run in a child interpreter by the doctor, prints one JSON line.

Run as ``python -c <this file's text> torch`` (or ``jax``): the doctor never imports torch
or jax itself, so a framework that crashes, hangs or prints garbage cannot take it down.
Every section catches its own errors; the JSON line is prefixed with MARKER because
frameworks print to stdout on import.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
import warnings
from typing import Any

MARKER = "GRETA_PROBE_JSON:"
# Variables worth reporting as the child actually sees them (after any startup hooks).
ENV_PREFIXES = (
    "HSA_",
    "HIP_",
    "ROCR_",
    "ROCM_",
    "CUDA_VISIBLE",
    "TRITON_",
    "JAX_",
    "XLA_",
    "PYTORCH_",
    "TORCH_",
    "MIOPEN_",
    "GPU_DEVICE",
)


def _error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text[:2000]


def _numpy() -> dict[str, Any]:
    try:
        import numpy
    except ModuleNotFoundError:
        return {"missing": True}
    except BaseException as exc:
        return {"error": _error(exc)}
    return {"version": str(getattr(numpy, "__version__", "?"))}


def _torch_devices(torch: Any) -> list[dict[str, Any]]:
    devices = []
    for index in range(torch.cuda.device_count()):
        entry: dict[str, Any] = {"index": index}
        try:
            props = torch.cuda.get_device_properties(index)
            entry["name"] = str(props.name)
            entry["arch"] = str(getattr(props, "gcnArchName", "") or "") or None
            entry["capability"] = f"{props.major}.{props.minor}"
            entry["total_memory"] = int(props.total_memory)
        except BaseException as exc:
            entry["error"] = _error(exc)
        devices.append(entry)
    return devices


def _torch() -> dict[str, Any]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            import torch
        except ModuleNotFoundError as exc:
            if exc.name == "torch":
                return {"missing": True}
            return {"error": _error(exc), "traceback": traceback.format_exc()[-3000:]}
        except BaseException as exc:
            return {"error": _error(exc), "traceback": traceback.format_exc()[-3000:]}
    out: dict[str, Any] = {
        "version": str(torch.__version__),
        "hip": getattr(torch.version, "hip", None),
        "cuda": getattr(torch.version, "cuda", None),
        "import_warnings": [str(w.message)[:500] for w in caught],
    }
    try:
        out["cuda_available"] = bool(torch.cuda.is_available())
        out["device_count"] = int(torch.cuda.device_count()) if out["cuda_available"] else 0
        out["arch_list"] = [str(a) for a in torch.cuda.get_arch_list()]
    except BaseException as exc:
        out["cuda_error"] = _error(exc)
        out.setdefault("cuda_available", False)
    if out.get("cuda_available"):
        out["devices"] = _torch_devices(torch)
        try:
            # A real kernel launch: this is where a wheel without the device's gfx fails
            # ("invalid device function") and where an unsupported override hangs.
            value = (torch.ones(8, device="cuda") * 2).sum().item()
            out["smoke"] = {"ok": value == 16.0, "value": value}
        except BaseException as exc:
            out["smoke"] = {"ok": False, "error": _error(exc)}
    try:
        import numpy

        array = numpy.arange(3, dtype=numpy.float32)
        back = torch.from_numpy(array).numpy()
        out["numpy_interop"] = {"ok": back.tolist() == [0.0, 1.0, 2.0]}
    except ModuleNotFoundError:
        out["numpy_interop"] = {"ok": None, "error": "numpy not installed"}
    except BaseException as exc:
        out["numpy_interop"] = {"ok": False, "error": _error(exc)}
    return out


def _triton() -> dict[str, Any]:
    try:
        import triton
    except ModuleNotFoundError as exc:
        if exc.name == "triton":
            return {"missing": True}
        return {"error": _error(exc)}
    except BaseException as exc:
        return {"error": _error(exc)}
    return {"version": str(getattr(triton, "__version__", "?"))}


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.messages.append(record.getMessage()[:1000])
        except Exception:
            self.messages.append(str(record.msg)[:1000])


def _jax() -> dict[str, Any]:
    handler = _Collect()
    logging.getLogger().addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                import jax
            except ModuleNotFoundError as exc:
                if exc.name == "jax":
                    return {"missing": True}
                return {"error": _error(exc)}
            except BaseException as exc:
                return {"error": _error(exc)}
            out: dict[str, Any] = {"version": str(jax.__version__)}
            try:
                import jaxlib

                out["jaxlib"] = str(getattr(jaxlib, "__version__", None) or "")
            except BaseException as exc:
                out["jaxlib_error"] = _error(exc)
            try:
                devices = jax.devices()
                out["backend"] = str(jax.default_backend())
                out["devices"] = [
                    {"platform": str(d.platform), "kind": str(getattr(d, "device_kind", ""))}
                    for d in devices
                ]
                try:
                    out["platform_version"] = str(devices[0].client.platform_version)
                except BaseException:
                    out["platform_version"] = None
            except BaseException as exc:
                out["devices_error"] = _error(exc)
        out["log"] = handler.messages[-20:] + [str(w.message)[:500] for w in caught][-20:]
        return out
    finally:
        logging.getLogger().removeHandler(handler)


def main(argv: list[str]) -> int:
    section = argv[0] if argv else "torch"
    result: dict[str, Any] = {
        "section": section,
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "env": {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)},
    }
    if section == "torch":
        result["numpy"] = _numpy()
        result["torch"] = _torch()
        result["triton"] = _triton()
    elif section == "jax":
        result["jax"] = _jax()
    else:
        result["error"] = f"unknown probe section {section!r}"
    sys.stdout.write("\n" + MARKER + json.dumps(result, default=str) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
