"""The imperative shell of `greta bench`: measure ceilings, time every case, write files."""

from __future__ import annotations

import itertools
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from greta_core.bench import cases as cases_mod
from greta_core.bench import metadata, report
from greta_core.bench.timing import TimingPolicy, host_time_per_call, synchronize, time_device
from greta_core.errors import BenchError

DEFAULT_L2_BYTES = 50_000_000  # H100; used when torch does not report the L2 size
MAX_INPUT_SETS = 8
SCHEMA = "greta-bench/1"


@dataclass(frozen=True)
class BenchOptions:
    preset: str = "smoke"
    ops: tuple[str, ...] = ()
    out: Path | None = None  # None: a new folder under the user's cache (default_out)
    device: str = "auto"  # "auto", "cuda" or "cpu"
    budget_s: float | None = None
    overhead: bool = True
    compile: bool = True
    graph: bool = False  # time GPU work from CUDA-graph replays


@dataclass(frozen=True)
class BenchResult:
    document: dict[str, Any]
    files: dict[str, Path]


def rotation_sets(input_bytes: int, l2_bytes: int, max_sets: int = MAX_INPUT_SETS) -> int:
    """How many input sets to rotate through so repeated calls do not just hit the L2.

    Inputs at least as large as the L2 need no rotation; smaller ones get enough sets to
    cover twice the L2, capped so tiny shapes do not allocate without limit.
    """
    if input_bytes <= 0 or input_bytes >= l2_bytes:
        return 1
    return max(1, min(max_sets, math.ceil(2 * l2_bytes / input_bytes)))


def policy_for(preset: str, device: str, graph: bool = False) -> TimingPolicy:
    if device == "cpu":
        return TimingPolicy(cpu_budget_s=0.05, cpu_max_calls=50, overhead_budget_s=0.2)
    rep = {"smoke": 50.0, "standard": 100.0, "perf": 200.0}[preset]
    return TimingPolicy(warmup_ms=25.0, rep_ms=rep, graph=graph)


CPU_NOTE = (
    "on a CPU the timings measure the torch references and Triton's interpreter on tiny "
    "shapes, not kernel speed: they show that every path runs, and are left out of the "
    "table (the CSV/JSON keep them)"
)


def default_out() -> Path:
    """A new folder under the user's cache: never the current directory unasked."""
    import datetime

    import platformdirs

    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path(platformdirs.user_cache_dir("greta", appauthor=False)) / "bench" / stamp


def pick_device(requested: str, preset: str) -> str:
    try:
        import torch
    except ImportError as exc:
        raise BenchError(f"greta bench needs torch ({exc})") from exc
    has_gpu = torch.cuda.is_available()
    if requested == "cuda" and not has_gpu:
        raise BenchError("--device cuda: torch sees no CUDA/ROCm GPU")
    device = "cuda" if (requested in ("auto", "cuda") and has_gpu) else "cpu"
    if device == "cpu" and preset != "smoke":
        raise BenchError(
            f"preset {preset!r} needs a GPU (its shapes take minutes per case on a CPU); "
            "use --preset smoke on a CPU"
        )
    return device


def _first_line(exc: BaseException) -> str:
    text = f"{exc.__class__.__name__}: {exc}".strip()
    return text.splitlines()[0][:300] if text else exc.__class__.__name__


def _first_tensor(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return value[0] if value else None
    return value


def rel_err(out: Any, ref: Any) -> float | None:
    """‖out − ref‖ / ‖ref‖ in float64 (NaN stays NaN, so it never looks good)."""
    out, ref = _first_tensor(out), _first_tensor(ref)
    if out is None or ref is None or tuple(out.shape) != tuple(ref.shape):
        return None
    o, r = out.double(), ref.double()
    return float((o - r).norm() / r.norm().clamp_min(1e-300))


# --- ceilings -------------------------------------------------------------------------


def measure_ceilings(preset: str, device: str, policy: TimingPolicy) -> dict[str, Any]:
    """Device-to-device copy bandwidth and square-matmul rate, measured in this run."""
    sizes = cases_mod.CEILINGS[preset]["cpu" if device == "cpu" else "gpu"]
    ceilings: dict[str, Any] = {}
    for name, measure, size in (
        ("copy", _measure_copy, sizes["copy_bytes"]),
        ("matmul", _measure_matmul, sizes["matmul_n"]),
    ):
        try:
            ceilings[name] = measure(size, device, policy)
        except Exception as exc:
            ceilings[name] = {"status": "error", "reason": _first_line(exc)}
        _free(device)
    return ceilings


def _measure_copy(nbytes: int, device: str, policy: TimingPolicy) -> dict[str, Any]:
    import torch

    src = torch.randn(nbytes // 2, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    dst.copy_(src)
    synchronize(device)
    t = time_device(lambda: dst.copy_(src), device, policy)
    return {
        "status": "ok",
        "bytes_per_tensor": nbytes,
        "median_ms": t.median_ms,
        "gbps": 2 * nbytes / (t.median_ms * 1e-3) / 1e9,  # bytes read + bytes written
        "method": t.method,
    }


def _measure_matmul(n: int, device: str, policy: TimingPolicy) -> dict[str, Any]:
    import torch

    # bf16 on the GPU (the matrix units' rate); float32 on the CPU, where bf16 is emulated.
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    torch.matmul(a, b)
    synchronize(device)
    t = time_device(lambda: torch.matmul(a, b), device, policy)
    return {
        "status": "ok",
        "n": n,
        "dtype": str(dtype).replace("torch.", ""),
        "median_ms": t.median_ms,
        "tflops": 2 * n**3 / (t.median_ms * 1e-3) / 1e12,
        "method": t.method,
    }


def _free(device: str) -> None:
    if device != "cpu":
        import torch

        torch.cuda.empty_cache()


# --- cases ----------------------------------------------------------------------------


def _base_row(op: str, params: cases_mod.Params, dtype: str, impl: str) -> report.Row:
    return {
        "op": op,
        "shape": cases_mod.describe(op, params),
        "dtype": dtype,
        "impl": impl,
        "status": "skipped",
        "reason": "",
    }


def _impl_names(case: cases_mod.Case) -> list[str]:
    """greta first, then the vendor variants, then torch.compile (stable within a rank)."""
    names = list(dict.fromkeys([*case.impls, *case.skipped]))
    return sorted(names, key=report.impl_rank)


def run_case(
    case: cases_mod.Case, device: str, policy: TimingPolicy, l2_bytes: int, compile_ok: bool
) -> list[report.Row]:
    """Warm up, check and time every implementation of one case."""
    import torch

    from greta_core import observe

    first = case.make_inputs()
    n_sets = rotation_sets(cases_mod.tensor_bytes(first), l2_bytes)
    sets = [first] + [case.make_inputs() for _ in range(n_sets - 1)]
    common = {
        "bound": case.cost.bound,
        "bytes_moved": case.cost.bytes_moved,
        "flops": case.cost.flops,
        "input_sets": n_sets,
        "note": case.note,
    }
    rows: list[report.Row] = []
    outputs: dict[str, Any] = {}
    for impl in _impl_names(case):
        row = _base_row(case.op, case.params, case.dtype, impl) | common
        rows.append(row)
        if impl in case.skipped:
            row["reason"] = case.skipped[impl]
            continue
        if impl == "torch.compile" and not compile_ok:
            row["reason"] = "disabled by --no-compile"
            continue
        fn = case.impls[impl]
        try:
            result = fn(*sets[0])  # warm-up: compilation, autotuning caches, handles
            synchronize(device)
            if case.comparable and (impl == "greta" or report.is_vendor(impl)):
                outputs.setdefault("greta" if impl == "greta" else "vendor", result)
            if impl == "greta":
                row["implementation_ran"] = observe.last_implementation(case.op)
            elif report.is_vendor(impl):
                row["implementation_ran"] = impl.partition(":")[2] or "torch"
            else:
                row["implementation_ran"] = "inductor"
            cycle = itertools.cycle(sets)
            timing = time_device(lambda fn=fn, cycle=cycle: fn(*next(cycle)), device, policy)
        except Exception as exc:
            row["status"] = "skipped" if impl in case.optional else "error"
            row["reason"] = _first_line(exc)
            continue
        row.update(status="ok", median_ms=timing.median_ms, timing_method=timing.method)
    if "greta" in outputs and "vendor" in outputs:
        greta_row = next(r for r in rows if r["impl"] == "greta")
        try:
            greta_row["check_rel_err"] = rel_err(outputs["greta"], outputs["vendor"])
        except Exception as exc:
            greta_row["check_rel_err"] = None
            greta_row["reason"] = f"check failed: {_first_line(exc)}"
    del sets, outputs
    torch._dynamo.reset()  # drop this case's compiled graphs and guards
    _free(device)
    return rows


def _skipped_rows(op: str, params: cases_mod.Params, dtype: str, reason: str) -> list[report.Row]:
    row = _base_row(op, params, dtype, "greta") | {"reason": reason}
    return [row]


# --- binding overhead -----------------------------------------------------------------


def measure_overhead(device: str, policy: TimingPolicy) -> list[report.Row]:
    """Host time per call of each binding on a tiny input, next to a trivial raw launch."""
    import torch
    import torch.nn.functional as F

    from greta_core import observe
    from greta_core.arch import interpreter_active

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    rows: list[report.Row] = []
    sync: Callable[[Any], None] = lambda _result: synchronize(device)  # noqa: E731
    raw_reason = (
        "raw Triton launches need a GPU (or TRITON_INTERPRET=1)"
        if device == "cpu" and not interpreter_active()
        else ""
    )

    def entry(
        binding: str,
        op: str,
        shape: str,
        make: Callable[[], Callable[[], Any]],
        finish: Callable[[Any], None] = sync,
        skip: str = "",
    ) -> None:
        row: report.Row = {
            "binding": binding,
            "op": op,
            "input": shape,
            "status": "skipped",
            "reason": skip,
        }
        rows.append(row)
        if skip:
            return
        try:
            fn = make()
            us, calls = host_time_per_call(fn, finish, policy)
        except Exception as exc:
            row.update(status="error", reason=_first_line(exc))
            return
        ran = (
            "triton"
            if op == "trivial"
            else "torch"
            if binding.startswith("torch eager")
            else observe.last_implementation(op)
        )
        row.update(status="ok", host_us_per_call=us, calls=calls, implementation_ran=ran)

    x = torch.randn(4, 64, device=device, dtype=dtype)
    y = torch.randn(4, 64, device=device, dtype=dtype)
    w = torch.randn(64, device=device, dtype=dtype)
    eps = cases_mod.EPS
    specs: dict[str, tuple[tuple[Any, ...], str, Callable[..., Any]]] = {
        "vec_add": ((x, y), "torch.add", torch.add),
        "rms_norm": ((x, w), "F.rms_norm", lambda a, b: F.rms_norm(a, (64,), b, eps)),
    }
    for op, (args, eager_name, eager) in specs.items():
        extra = (eps,) if op == "rms_norm" else ()
        entry(
            f"torch eager {eager_name} (vendor)",
            op,
            "4x64",
            lambda eager=eager, args=args: lambda: eager(*args),
        )
        greta_op, why = cases_mod.greta_torch_op(op)
        entry(
            f"torch.ops.greta.{op}",
            op,
            "4x64",
            lambda g=greta_op, args=args, extra=extra: lambda: g(*args, *extra),
            skip=why,
        )
        raw_fn, raw_why = _raw_op(op)
        entry(
            f"greta_core.raw.{op}",
            op,
            "4x64",
            lambda r=raw_fn, args=args, extra=extra: lambda: r(*args, *extra),
            skip=raw_reason or raw_why,
        )
        jax_make, jax_why = _jax_call(op, args, extra)
        entry(
            f"greta_core.jax.{op} (jax.jit)",
            op,
            "4x64",
            jax_make,
            finish=lambda r: r.block_until_ready(),
            skip=jax_why,
        )

    def trivial() -> Callable[[], Any]:
        from greta_core.bench.trivial import trivial_kernel

        out = torch.empty(64, device=device, dtype=torch.int32)
        return lambda: trivial_kernel[(1,)](out, BLOCK=64)

    try:
        import triton  # noqa: F401

        triton_why = ""
    except ImportError as exc:
        triton_why = f"triton not importable: {exc}"
    entry(
        "raw Triton trivial kernel", "trivial", "64 int32", trivial, skip=raw_reason or triton_why
    )
    return rows


def _raw_op(op: str) -> tuple[Callable[..., Any] | None, str]:
    try:
        from greta_core import raw
    except Exception as exc:
        return None, f"greta_core.raw failed to import: {_first_line(exc)}"
    fn = getattr(raw, op, None)
    return fn, "" if fn else f"greta_core.raw.{op} does not exist in this build"


def _jax_call(
    op: str, args: tuple[Any, ...], extra: tuple[Any, ...]
) -> tuple[Callable[[], Callable[[], Any]], str]:
    try:
        import jax
        import numpy as np

        from greta_core import jax as gjax
    except Exception as exc:
        return (lambda: lambda: None), f"jax binding not importable: {_first_line(exc)}"
    fn = getattr(gjax, op, None)
    if fn is None:
        return (lambda: lambda: None), f"greta_core.jax.{op} does not exist in this build"

    def make() -> Callable[[], Any]:
        # Same values as the torch inputs, moved through the host (no dlpack coupling).
        jargs = [jax.numpy.asarray(np.asarray(a.float().cpu())).astype(_jax_dtype(a)) for a in args]
        jitted = jax.jit(lambda *xs: fn(*xs, *extra))
        return lambda: jitted(*jargs)

    return make, ""


def _jax_dtype(t: Any) -> Any:
    import jax.numpy as jnp

    return jnp.bfloat16 if "bfloat16" in str(t.dtype) else jnp.float32


# --- the whole run --------------------------------------------------------------------


def run(options: BenchOptions, log: Callable[[str], None] = print) -> BenchResult:
    # JAX would otherwise take 75% of GPU memory the moment it starts, starving torch.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    try:
        selected = cases_mod.select(options.preset, list(options.ops) or None)
    except ValueError as exc:
        raise BenchError(str(exc)) from exc
    device = pick_device(options.device, options.preset)
    import torch

    start = time.perf_counter()
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    dtype_name = str(dtype).replace("torch.", "")
    policy = policy_for(options.preset, device, options.graph)
    meta = metadata.collect(options.preset, device)
    meta["dtype"] = dtype_name
    l2_bytes = DEFAULT_L2_BYTES
    if device != "cpu":
        l2_bytes = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or l2_bytes
    log(f"greta bench: preset {options.preset} on {meta.get('gpu_name') or 'CPU'} ({dtype_name})")
    if device == "cpu":
        meta["timings"] = "interpreter"  # see CPU_NOTE
        log(f"  note: {CPU_NOTE}")

    ceilings = measure_ceilings(options.preset, device, policy)
    log(f"  ceilings: {_ceiling_text(ceilings)}")
    overhead = measure_overhead(device, policy) if options.overhead else []

    rows: list[report.Row] = []
    for op, params in selected:
        label = f"{op} {cases_mod.describe(op, params)}"
        if options.budget_s is not None and time.perf_counter() - start > options.budget_s:
            rows += _skipped_rows(
                op, params, dtype_name, f"time budget of {options.budget_s:g} s used up"
            )
            continue
        try:
            case = cases_mod.build_case(op, params, device, dtype)
            case_rows = run_case(case, device, policy, l2_bytes, options.compile)
        except Exception as exc:
            case_rows = _skipped_rows(op, params, dtype_name, _first_line(exc))
            case_rows[0]["status"] = "error"
            _free(device)
        rows += case_rows
        log(f"  {label}: " + ", ".join(f"{r['impl']}={r['status']}" for r in case_rows))

    rows = report.derive(rows, ceilings)
    meta["elapsed_s"] = round(time.perf_counter() - start, 1)
    document = {
        "schema": SCHEMA,
        "metadata": meta,
        "ceilings": ceilings,
        "cases": case_summaries(rows),
        "results": rows,
        "overhead": overhead,
    }
    files = write_outputs(options.out or default_out(), document)
    return BenchResult(document=document, files=files)


def case_summaries(rows: list[report.Row]) -> list[dict[str, Any]]:
    """One entry per case; its status is the GRETA implementation's (the thing under test)."""
    summaries: dict[tuple[str, str, str], dict[str, Any]] = {}
    for row in rows:
        key = (row["op"], row["shape"], row["dtype"])
        entry = summaries.setdefault(
            key,
            {
                "op": row["op"],
                "shape": row["shape"],
                "dtype": row["dtype"],
                "status": "skipped",
                "reason": "no GRETA implementation row",
                "impls": {},
            },
        )
        entry["impls"][row["impl"]] = row["status"]
        if row["impl"] == "greta":
            entry["status"], entry["reason"] = row["status"], row.get("reason", "")
    return list(summaries.values())


def write_outputs(out: Path, document: dict[str, Any]) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "csv": out / "bench.csv",
        "json": out / "bench.json",
        "overhead_csv": out / "overhead.csv",
        "png": out / "bench.png",
    }
    report.write_csv(files["csv"], document["results"], report.FIELDS)
    report.write_csv(files["overhead_csv"], document["overhead"], report.OVERHEAD_FIELDS)
    report.write_json(files["json"], document)
    meta = document["metadata"]
    title = (
        f"greta bench {meta['preset']} on {meta.get('gpu_name') or 'CPU'} ({meta.get('dtype')}), "
        f"torch {meta['versions'].get('torch')}, triton {meta['versions'].get('triton')}, "
        f"{(meta.get('commit') or 'no git')[:10]}, {meta['date']}"
    )
    try:
        report.plot(files["png"], document["results"], document["ceilings"], title)
    except ImportError as exc:
        # matplotlib is the bench extra; the numbers are still in CSV/JSON.
        files.pop("png")
        document["metadata"]["chart"] = f"not drawn: {exc}"
        report.write_json(files["json"], document)
    return files


def _ceiling_text(ceilings: dict[str, Any]) -> str:
    parts = []
    copy, mm = ceilings.get("copy", {}), ceilings.get("matmul", {})
    parts.append(
        f"copy {copy['gbps']:.1f} GB/s"
        if copy.get("status") == "ok"
        else f"copy {copy.get('reason')}"
    )
    parts.append(
        f"matmul {mm['tflops']:.2f} TFLOP/s ({mm['dtype']} {mm['n']}^3)"
        if mm.get("status") == "ok"
        else f"matmul {mm.get('reason')}"
    )
    return "; ".join(parts)
