"""Ahead-of-time compilation of every GRETA kernel for any GPU arch, on any machine.

``python -m greta_core.kernel_wheels.aot --arch gfx942,gfx1100,gfx1201,sm_90 --report aot.json``
compiles each kernel's :class:`~greta_core.kernels._aot.AotSpec` for each arch with no
GPU present and reports, per kernel and arch: ok/error, compile seconds and the matrix
instructions in the generated code (MFMA on CDNA, WMMA on RDNA3/4, wgmma on Hopper).

Kernels are compiled through Triton's own JIT path (``JITFunction.warmup``) with a
stand-in driver that reports the target GPU. That is deliberate: the JIT builds the
signature, constexprs and specialisation attributes (16-byte divisibility, AMD's 32-bit
pointer range, ints equal to 1 turned into constexprs) itself, so the cache key of
every compiled kernel is the key the JIT computes when it meets the same call on a
real GPU of that arch. Kernel wheels (``greta_core.kernel_wheels.wheelbuild``) ship these cache
entries; ``greta_core.kernel_wheels.precompiled`` serves them at run time.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import pkgutil
import platform
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from greta_core.arch import interpreter_active, is_hip, normalize_arch, warp_size
from greta_core.errors import AotError
from greta_core.kernel_wheels.host_launchers import spec_of
from greta_core.ops import declare as _declared

# Which specialisations of the int arguments to compile (see `int_args_for`).
VARIANTS: tuple[str, ...] = ("aligned", "ragged")
# The one variant of a spec that carries its declared case's ints (AotSpec.int_divisible):
# compiled whatever VARIANTS a build selects.
CASE = "case"

# Values the stand-in arguments take. Divisible by 16 -> Triton adds tt.divisibility=16;
# odd -> no attribute. Never 1: the JIT turns an int equal to 1 into a constexpr (specs
# that want that case list the argument in `constexprs` with value 1).
_ALIGNED_INT = {"i32": 4096, "i64": 2**33, "u32": 4096, "u64": 2**33}
_RAGGED_INT = {"i32": 4099, "i64": 2**33 + 3, "u32": 4099, "u64": 2**33 + 3}
_SCALAR_VALUE: dict[str, Any] = {"fp32": 1.5, "fp64": 1.5, "i1": True, "u1": True}
# Signature spellings -> triton.language dtype names (floats are spelled alike).
_TL_DTYPE_NAMES = {
    **{f"i{bits}": f"int{bits}" for bits in (1, 8, 16, 32, 64)},
    **{f"u{bits}": f"uint{bits}" for bits in (1, 8, 16, 32, 64)},
}

MATRIX_PATTERNS: dict[str, tuple[str, str]] = {
    # family -> (asm key to scan, regex of the matrix instructions)
    "cdna": ("amdgcn", r"\bv_mfma_\w+"),
    "rdna": ("amdgcn", r"\bv_wmma_\w+"),
    "cuda": ("ptx", r"\b(?:wgmma\.mma_async|mma\.sync)(?:\.\w+)*"),
}


@dataclass
class CompileResult:
    spec: str  # AotSpec.name, e.g. "vec_add[fp32]"
    module: str  # greta_core.kernels.<module>
    kernel: str  # Triton function name
    arch: str
    variant: str
    ok: bool
    seconds: float
    error: str = ""
    cpu_seconds: float = 0.0  # this process's CPU time for the compile (wall is `seconds`)
    key: str = ""  # Triton cache key (hex); the directory is its base32 form
    uses_matrix_units: bool = False
    matrix_instructions: list[str] = field(default_factory=list)
    sass_matrix_instructions: list[str] = field(default_factory=list)
    signature: dict[str, str] = field(default_factory=dict)  # as the JIT specialised it
    specialised: dict[str, list[Any]] = field(default_factory=dict)  # arg -> attributes
    # What Triton's host launcher needs (kernel wheels ship it; greta_core.kernel_wheels.host_launchers).
    launcher: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def matrix_ok(self) -> bool:
        return not self.uses_matrix_units or bool(self.matrix_instructions)

    def to_row(self) -> dict[str, Any]:
        row = asdict(self)
        del row["launcher"]
        row["matrix_ok"] = self.matrix_ok
        return row


# --- targets --------------------------------------------------------------------------


def target_for(arch: str) -> Any:
    """Triton's GPUTarget for a GRETA arch name (warp size from the arch family)."""
    from triton.backends.compiler import GPUTarget

    arch = normalize_arch(arch)
    if is_hip(arch):
        return GPUTarget("hip", arch, warp_size(arch))
    match = re.fullmatch(r"sm_(\d+)", arch)
    if not match:
        raise AotError(f"cannot compile for arch {arch!r}: expected gfxNNN or sm_NN")
    return GPUTarget("cuda", int(match.group(1)), 32)


def matrix_family(arch: str) -> str:
    if is_hip(arch):
        return "cdna" if warp_size(arch) == 64 else "rdna"
    return "cuda"


def parse_archs(text: str) -> list[str]:
    archs = []
    for part in text.split(","):
        if not part.strip():
            continue
        try:
            archs.append(normalize_arch(part))
        except ValueError as exc:
            raise AotError(str(exc)) from exc
    if not archs:
        raise AotError("no arch given: e.g. --arch gfx942,sm_90")
    return archs


class _TargetDriver:
    """Stands in for Triton's active GPU driver: reports `target`, launches nothing."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> Any:
        return self.target


@contextlib.contextmanager
def compiling_for(arch: str, cache_dir: str | os.PathLike[str] | None) -> Iterator[None]:
    """Make Triton's JIT believe the current GPU is `arch`; write the cache to `cache_dir`."""
    from triton import knobs
    from triton.runtime.driver import driver

    saved_dir = knobs.cache.dir
    saved_manager = knobs.cache.manager_class
    saved_active = driver._active
    driver.set_active(_TargetDriver(target_for(arch)))
    # A plain file cache in our own directory: the result must be compiled here, not
    # served from the user's cache or an installed kernel wheel.
    knobs.cache.manager_class = None
    if cache_dir is not None:
        knobs.cache.dir = str(cache_dir)
    try:
        yield
    finally:
        driver._active = saved_active
        knobs.cache.manager_class = saved_manager
        knobs.cache.dir = saved_dir


# --- discovery ------------------------------------------------------------------------


@dataclass
class Discovered:
    module: str
    specs: list[Any]
    error: str = ""


def kernel_modules() -> list[str]:
    """greta_core.kernels.* modules (not _private helpers), sorted by name."""
    import greta_core.kernels as package

    return sorted(
        f"{package.__name__}.{info.name}"
        for info in pkgutil.iter_modules(package.__path__)
        if not info.name.startswith("_")
    )


def discover(arch: str, only: Sequence[str] = ()) -> list[Discovered]:
    """Every kernel module's `aot_specs(arch)`; a module that fails is reported, not fatal."""
    found = []
    for name in kernel_modules():
        short = name.rsplit(".", 1)[-1]
        if only and short not in only:
            continue
        try:
            module = importlib.import_module(name)
            make = getattr(module, "aot_specs", None) or _declared.aot_maker(short)
            if make is None:
                continue
            found.append(Discovered(short, list(make(arch))))
        except Exception as exc:
            found.append(Discovered(short, [], f"{type(exc).__name__}: {exc}"))
    return found


# --- compiling one spec ---------------------------------------------------------------


def int_args_for(spec: Any, variant: str) -> dict[str, int]:
    """Stand-in int values: all divisible by 16 ("aligned"), none ("ragged"), or, for a spec
    that carries its case's ints ("case"), each as divisible as that call's."""
    divisible = getattr(spec, "int_divisible", None)
    if divisible is not None:
        # An int the case leaves out is one the kernel does not specialise on alignment:
        # any value gives the same key.
        return {
            name: (_ALIGNED_INT if divisible.get(name, True) else _RAGGED_INT)[ty]
            for name, ty in spec.signature.items()
            if ty in _ALIGNED_INT
        }
    table = _ALIGNED_INT if variant == "aligned" else _RAGGED_INT
    return {name: table[ty] for name, ty in spec.signature.items() if ty in table}


def has_int_args(spec: Any) -> bool:
    return any(ty in _ALIGNED_INT for ty in spec.signature.values())


def int_kind(spec: Any) -> str:
    """What decides a spec's int specialisation: CASE (its own, see `int_args_for`),
    "variants" (the build's VARIANTS) or "" (no int args). `variants_of` takes it."""
    if getattr(spec, "int_divisible", None) is not None:
        return CASE
    return "variants" if has_int_args(spec) else ""


# Kernel modules whose calls never pass every int ragged, so their wheel entries are
# "aligned" only. RoPE passes the strides of its contiguous result: with a head_dim
# divisible by 16 some int always is (tests/test_precompiled_set.py). (Attention's specs
# carry their cases' ints: `int_kind`.)
_ALIGNED_ONLY_MODULES: frozenset[str] = frozenset({"rope"})


def precompiled_int_variants(module: str) -> tuple[str, ...]:
    """The int specialisations a kernel module's wheel entries cover: "aligned" only for the
    model-width norms (``configs.blocks.MODEL_ROW_WIDTHS`` are multiples of 16) and for
    the modules no call reaches with every int ragged; both for the rest."""
    from greta_core.configs.blocks import MODEL_WIDTH_OPS

    if module in MODEL_WIDTH_OPS or module in _ALIGNED_ONLY_MODULES:
        return ("aligned",)
    return VARIANTS


def variants_of(has_ints: bool | str, variants: Sequence[str], module: str = "") -> list[str]:
    """The variants compiled for a spec of kernel `module` (`has_ints`: its `int_kind`, or
    whether it has int args): CASE alone for a spec with its own ints; else "ragged" only
    differs from "aligned" for int args, and only those `precompiled_int_variants` covers."""
    if has_ints == CASE:
        return [CASE]
    covered = precompiled_int_variants(module)
    return [v for v in variants if (v != "ragged" or has_ints) and v in covered]


def _stand_in(name: str, ty: str, ints: dict[str, int]) -> Any:
    import triton.language as tl
    from triton.runtime.jit import MockTensor

    if ty.startswith("*"):
        # MockTensor: data_ptr() == 0 (16-byte aligned), ptr_range() == 0 (within 2 GiB),
        # i.e. what a freshly allocated framework tensor looks like to the JIT.
        return MockTensor(tl.dtype(_TL_DTYPE_NAMES.get(ty[1:], ty[1:])))
    if name in ints:
        return ints[name]
    if ty in _SCALAR_VALUE:
        return _SCALAR_VALUE[ty]
    raise AotError(f"argument {name!r}: unsupported signature type {ty!r}")


def _jit_options(spec: Any) -> dict[str, Any]:
    return dict(spec.options)


def compile_spec(spec: Any, module: str, arch: str, variant: str) -> CompileResult:
    """Compile `spec` for `arch` the way the JIT would (inside `compiling_for(arch, ...)`)."""
    fn = spec.kernel
    result = CompileResult(
        spec=spec.name,
        module=module,
        kernel=getattr(fn, "__name__", str(fn)),
        arch=arch,
        variant=variant,
        ok=False,
        seconds=0.0,
        uses_matrix_units=spec.uses_matrix_units,
    )
    start, cpu_start = time.perf_counter(), time.process_time()
    try:
        names = list(fn.arg_names)
        unknown = (set(spec.signature) | set(spec.constexprs)) - set(names)
        if unknown:
            raise AotError(f"spec names arguments the kernel lacks: {sorted(unknown)}")
        missing = set(names) - set(spec.signature) - set(spec.constexprs)
        if missing:
            raise AotError(f"spec gives no type or value for: {sorted(missing)}")
        ints = int_args_for(spec, variant)
        args = [
            spec.constexprs[n] if n in spec.constexprs else _stand_in(n, spec.signature[n], ints)
            for n in names
        ]
        # Fresh per-process JIT state: the binder caches the target it was built for.
        fn.device_caches.clear()
        compiled = fn.warmup(*args, grid=(1,), **_jit_options(spec))
        result.key = compiled.hash
        result.signature = dict(compiled.src.signature)
        result.specialised = {
            names[path[0]]: attrs for path, attrs in compiled.src.attrs.items() if attrs
        }
        for name, ty in spec.signature.items():
            got = result.signature.get(name)
            if got != ty and not (got == "constexpr" and ty in _ALIGNED_INT):
                raise AotError(f"argument {name!r}: spec says {ty!r}, the JIT saw {got!r}")
        asm_key, pattern = MATRIX_PATTERNS[matrix_family(arch)]
        text = compiled.asm.get(asm_key, "")
        result.matrix_instructions = sorted(set(re.findall(pattern, text)))
        if spec.uses_matrix_units and matrix_family(arch) == "cuda":
            result.sass_matrix_instructions = _sass_matrix_instructions(compiled)
        result.launcher = spec_of(compiled, entry="")
        result.ok = True
    except Exception as exc:
        result.error = f"{type(exc).__name__}: {exc}".strip()[:2000]
    result.seconds = round(time.perf_counter() - start, 4)
    result.cpu_seconds = round(time.process_time() - cpu_start, 4)
    return result


def _sass_matrix_instructions(compiled: Any) -> list[str]:
    """HGMMA/HMMA in the cubin's SASS, when Triton's bundled cuobjdump can disassemble it."""
    try:
        from triton.tools.disasm import get_sass

        sass = get_sass(compiled.asm["cubin"])
    except Exception:
        return []
    return sorted(set(re.findall(r"\b(?:HGMMA|HMMA)(?:\.\w+)*", sass)))


# --- whole runs -----------------------------------------------------------------------


@dataclass
class AotRun:
    archs: list[str]
    results: list[CompileResult]
    module_errors: list[dict[str, str]]
    seconds_per_arch: dict[str, float]
    environment: dict[str, str]

    @property
    def ok(self) -> bool:
        return not self.module_errors and all(r.ok and r.matrix_ok for r in self.results)

    def to_json(self) -> dict[str, Any]:
        results = [r.to_row() for r in self.results]
        return {
            "archs": self.archs,
            "ok": self.ok,
            "environment": self.environment,
            "seconds_per_arch": self.seconds_per_arch,
            "module_errors": self.module_errors,
            "results": results,
        }


def environment() -> dict[str, str]:
    import triton

    # SOURCE_DATE_EPOCH (reproducible-builds.org): a fixed build date gives byte-identical
    # wheels from identical inputs.
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    when = time.gmtime(int(epoch)) if epoch.isdigit() else time.gmtime()
    return {
        "triton": triton.__version__,
        "triton_fingerprint": triton_fingerprint(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", when),
    }


def triton_fingerprint() -> str:
    """Hash of Triton's own build (sources + libtriton): part of every cache key.

    Two installs with the same fingerprint compute the same cache keys; the version
    string alone is not enough (a cp311 and a cp312 build of one version differ).
    """
    import hashlib

    from triton.runtime.cache import triton_key

    return hashlib.sha256(triton_key().encode()).hexdigest()[:32]


def run_aot(
    archs: Sequence[str],
    cache_dir: str | os.PathLike[str] | None,
    *,
    only: Sequence[str] = (),
    variants: Sequence[str] = VARIANTS,
    progress: Any = None,
) -> AotRun:
    """Compile every discovered spec for every arch; cache entries land in `cache_dir`."""
    if interpreter_active():
        raise AotError(
            "TRITON_INTERPRET is set: kernels are interpreted, not compiled; "
            "run the AOT compiler in a process without it"
        )
    results: list[CompileResult] = []
    module_errors: list[dict[str, str]] = []
    seconds: dict[str, float] = {}
    for arch in archs:
        start = time.perf_counter()
        discovered = discover(arch, only)
        if only and not discovered:
            raise AotError(f"no kernel module named {', '.join(only)} in greta_core.kernels")
        with compiling_for(arch, cache_dir):
            for found in discovered:
                if found.error:
                    module_errors.append(
                        {"module": found.module, "arch": arch, "error": found.error}
                    )
                for spec in found.specs:
                    for variant in variants_of(int_kind(spec), variants, found.module):
                        res = compile_spec(spec, found.module, arch, variant)
                        results.append(res)
                        if progress:
                            progress(res)
        seconds[arch] = round(time.perf_counter() - start, 3)
    return AotRun(list(archs), results, module_errors, seconds, environment())


# --- command line ---------------------------------------------------------------------


def _print_result(res: CompileResult) -> None:
    status = "ok" if res.ok else "ERROR"
    if res.ok and not res.matrix_ok:
        status = "NO-MATRIX"
    mi = ",".join(res.matrix_instructions[:3]) + ("..." if len(res.matrix_instructions) > 3 else "")
    line = f"{res.arch:8} {res.spec:40} {res.variant:8} {status:9} {res.seconds:7.2f}s {mi}"
    print(line.rstrip(), flush=True)
    if not res.ok:
        print(f"         {res.error.splitlines()[0] if res.error else ''}", flush=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m greta_core.kernel_wheels.aot",
        description="Compile every GRETA kernel for GPU archs without a GPU and report.",
    )
    add_arguments(parser)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arch", required=True, help="comma list, e.g. gfx942,gfx1100,sm_90")
    parser.add_argument("--report", type=Path, help="write the JSON report here")
    parser.add_argument("--kernels", default="", help="comma list of kernel modules (default all)")
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="int specialisations to compile: aligned (ints divisible by 16), ragged (not); "
        "specs derived with their cases' ints compile once, as those",
    )
    parser.add_argument("--cache-dir", type=Path, help="keep the compiled cache entries here")
    parser.add_argument("--quiet", action="store_true")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if interpreter_active():
        # The interpreter swaps @triton.jit for an interpreted function at import time;
        # compile in a clean child process instead of failing.
        if os.environ.get("GRETA_AOT_CHILD") == "1":
            print(
                "greta aot: TRITON_INTERPRET is still on in the child; not compiling",
                file=sys.stderr,
            )
            return 2
        # "0", not unset: an environment's greta-env.pth (cpu row) re-sets unset variables.
        env = {**os.environ, "TRITON_INTERPRET": "0", "GRETA_AOT_CHILD": "1"}
        argv = list(sys.argv[1:] if argv is None else argv)
        # Isolated (-I): the user's relative --out/--cache-dir keep the working directory,
        # which is then on no import path.
        from greta_install.commandline import greta_child

        return subprocess.call(greta_child("greta_core.kernel_wheels.aot", *argv), env=env)
    try:
        archs = parse_archs(args.arch)
        variants = [v.strip() for v in args.variants.split(",") if v.strip()]
        bad = [v for v in variants if v not in VARIANTS]
        if bad or not variants:
            raise AotError(f"unknown --variants {bad}: choose from {', '.join(VARIANTS)}")
        only = [k.strip() for k in args.kernels.split(",") if k.strip()]
        import tempfile

        with contextlib.ExitStack() as stack:
            cache_dir = args.cache_dir or stack.enter_context(
                tempfile.TemporaryDirectory(prefix="greta-aot-")
            )
            run = run_aot(
                archs,
                cache_dir,
                only=only,
                variants=variants,
                progress=None if args.quiet else _print_result,
            )
    except AotError as exc:
        print(f"greta aot: {exc}", file=sys.stderr)
        return 2
    for err in run.module_errors:
        print(f"{err['arch']:8} module {err['module']}: ERROR {err['error']}", file=sys.stderr)
    for arch, secs in run.seconds_per_arch.items():
        n = sum(1 for r in run.results if r.arch == arch)
        print(f"{arch}: {n} compiles in {secs:.1f}s")
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(json.dumps(run.to_json(), indent=1, sort_keys=True) + "\n")
    return 0 if run.ok else 1


if __name__ == "__main__":
    sys.exit(main())
