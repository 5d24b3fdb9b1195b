"""`greta build-kernels`: one kernel wheel per GPU arch, built on any machine (no GPU needed).

Each wheel (``greta_kernels_<arch>-<version>-py3-none-any.whl``) holds the arch's launch
config table (``configs.json``), the Triton cache entries of every kernel spec compiled
for the arch with the installed Triton (``precompiled/<key>/``), and ``manifest.json``
(kernels and specialisations covered, arch, Triton version and build fingerprint, build
date, source hash) and ``launchers.json``, what Triton's host launcher of each kernel
signature is built from (built on the user's machine by ``greta warm``). The kernels compile
in parallel worker processes (``--jobs``, default all cores); the wheel's bytes do not depend
on the job count.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from greta_core.errors import AotError
from greta_core.kernel_wheels.aot import variants_of
from greta_install.archs import triton_cannot_target

HELP = "Build GRETA kernel wheels (precompiled Triton code + tuned configs) per GPU arch."

MANIFEST_FORMAT = 1
# Cache-entry files a wheel keeps: metadata, group index, binary and its text assembly
# (the assembly lets `greta` and users check the code without a GPU; IRs are dropped).
_KEEP_SUFFIXES = (".json", ".cubin", ".hsaco", ".ptx", ".amdgcn")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arch", required=True, help="comma list: gfx942,gfx1100,gfx1201,sm_90")
    parser.add_argument("--out", type=Path, default=Path("dist"), help="wheel directory")
    parser.add_argument("--kernels", default="", help="comma list of kernel modules (default all)")
    parser.add_argument(
        "--variants",
        default="aligned,ragged",
        help="int specialisations (see python -m greta_core.kernel_wheels.aot)",
    )
    parser.add_argument(
        "--configs",
        type=Path,
        help="config table to ship instead of the built-in one (e.g. from `greta tune`); "
        "only with a single --arch",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=0,
        help="worker processes compiling kernels in parallel "
        "(default: GRETA_BUILD_JOBS, else all CPU cores)",
    )
    parser.add_argument("--report", type=Path, help="write the AOT report (JSON) here")
    parser.add_argument(
        "--index",
        type=Path,
        help="also write the built wheels into this static PEP 503 index (grows arch by arch; "
        "serve it and point GRETA_KERNEL_INDEX at it, or pass it as --kernel-wheels DIR)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="list, per arch, the kernel variants the table can request and the estimated "
        "build time and size; compile nothing",
    )


def run(args: argparse.Namespace) -> int:
    from greta_core.kernel_wheels.aot import parse_archs

    try:
        archs = parse_archs(args.arch)
        if args.configs and len(archs) != 1:
            raise AotError("--configs needs exactly one --arch")
        variants = [v.strip() for v in args.variants.split(",") if v.strip()]
        only = [k.strip() for k in args.kernels.split(",") if k.strip()]
        configs_text = args.configs.read_text() if args.configs else None
    except (AotError, OSError) as exc:
        print(f"greta build-kernels: {exc}", file=sys.stderr)
        return 2
    if getattr(args, "dry_run", False):
        for row in plan_counts(archs, only, variants, configs_text):
            print(format_plan_row(row, args.jobs))
        return 0
    start = time.perf_counter()
    try:
        outcomes = build_all(
            archs, args.out, only=only, variants=variants, configs_text=configs_text, jobs=args.jobs
        )
    except AotError as exc:
        print(f"greta build-kernels: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # The workers are stopped; a wheel is written whole or not at all.
        print("greta build-kernels: interrupted; workers stopped", file=sys.stderr)
        return 130
    failed = False
    built = 0
    for outcome in outcomes:
        if not outcome.get("fatal") and not outcome.get("compiled"):
            # An arch nothing compiles for (a typo like gfx9999) must not ship an empty wheel.
            Path(outcome.get("wheel", "")).unlink(missing_ok=True)
            outcome["fatal"] = "no kernel compiled for this arch; no wheel written"
        if outcome.get("fatal"):
            print(f"{outcome['arch']}: FAILED: {outcome['fatal']}", file=sys.stderr)
            failed = True
            continue
        built += 1
        bad = [r for r in outcome["results"] if not r["ok"]]
        failed = failed or bool(bad) or bool(outcome["module_errors"])
        print(
            f"{outcome['arch']}: {outcome['wheel']} "
            f"({outcome['compiled']} kernels, {len(bad)} errors, {outcome['seconds']:.1f}s)"
        )
        for r in bad:
            print(f"  {r['spec']} [{r['variant']}]: {r['error'].splitlines()[0]}", file=sys.stderr)
        for err in outcome["module_errors"]:
            print(f"  module {err['module']}: {err['error']}", file=sys.stderr)
    print(
        f"built {built} of {len(outcomes)} wheel(s) in {time.perf_counter() - start:.1f}s"
        + ("; see the errors above" if failed else "")
    )
    if getattr(args, "index", None) and not failed:
        from greta_install.install.kernel_build import write_index

        wheels = [Path(o["wheel"]) for o in outcomes if o.get("wheel") and not o.get("fatal")]
        index = write_index(wheels, args.index)
        print(f"index: {index} ({len(wheels)} wheel(s) added; serve it as GRETA_KERNEL_INDEX)")
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(json.dumps(outcomes, indent=1, sort_keys=True) + "\n")
    return 1 if failed else 0


def build_all(
    archs: Sequence[str],
    out_dir: Path,
    *,
    only: Sequence[str] = (),
    variants: Sequence[str] = ("aligned", "ragged"),
    configs_text: str | None = None,
    jobs: int = 0,
    progress: Callable[[int, int, Any], None] | None = None,
) -> list[dict[str, Any]]:
    """Build one wheel per arch; returns one outcome dict per arch, in `archs` order.

    Every kernel specialisation of every arch is one task for `jobs` spawned worker
    processes (``greta_core.kernel_wheels.buildpool``; 0: ``GRETA_BUILD_JOBS`` or all
    cores). The wheels are put together here from the results in spec order, so their
    bytes do not depend on `jobs`. An arch with any failed kernel gets no wheel: its
    outcome's ``fatal`` names the kernels.
    """
    import triton

    from greta_core.configs import shipped_table
    from greta_core.kernel_wheels import buildpool

    jobs = buildpool.resolve_jobs(jobs)
    say = progress or print_progress
    start = time.perf_counter()
    print(
        f"building kernel wheels for {', '.join(archs)} with {jobs} worker process(es)",
        flush=True,
    )
    outcomes: dict[str, dict[str, Any]] = {}
    tables: dict[str, str] = {}
    for arch in archs:
        refused = triton_cannot_target(arch, triton.__version__)
        if refused:  # no compile at all: it would fail every kernel in the pass pipeline
            outcomes[arch] = {"arch": arch, "fatal": refused}
            continue
        try:
            tables[arch] = configs_text if configs_text is not None else shipped_table(arch)
            json.loads(tables[arch])  # a broken table must fail the build, not the user's run
        except (OSError, ValueError) as exc:
            outcomes[arch] = {"arch": arch, "fatal": f"config table: {exc}"}
    with contextlib.ExitStack() as stack:
        staging = {
            arch: stack.enter_context(tempfile.TemporaryDirectory(prefix=f"greta-kernels-{arch}-"))
            for arch in archs
        }
        # Entered after the staging dirs: the workers stop before those are removed.
        pool = stack.enter_context(buildpool.worker_pool(jobs))
        found = {
            arch: pool.submit(buildpool.discover_specs, arch, list(only), tables[arch])
            for arch in archs
            if arch not in outcomes
        }
        tasks: list[buildpool.Task] = []
        module_errors: dict[str, list[dict[str, str]]] = {arch: [] for arch in archs}
        for arch, future in found.items():
            try:
                modules = future.result()
            except Exception as exc:
                outcomes[arch] = {"arch": arch, "fatal": f"{type(exc).__name__}: {exc}"}
                continue
            if only and not modules:
                outcomes[arch] = {
                    "arch": arch,
                    "fatal": f"no kernel module named {', '.join(only)} in greta_core.kernels",
                }
                continue
            for module, specs, error in modules:
                if error:
                    module_errors[arch].append({"module": module, "arch": arch, "error": error})
                for index, (name, kind) in enumerate(specs):
                    for variant in variants_of(kind, variants, module):
                        tasks.append(
                            buildpool.Task(
                                arch, module, index, name, variant, staging[arch], tables[arch]
                            )
                        )
        print(f"{len(tasks)} kernels to compile", flush=True)
        results = buildpool.compile_all(pool, tasks, jobs, progress=say)
        for arch in archs:
            if arch in outcomes:
                continue
            mine = [r for r in results if r.arch == arch]
            outcomes[arch] = package_arch(
                arch, Path(staging[arch]), Path(out_dir), mine, module_errors[arch],
                list(variants), tables[arch], time.perf_counter() - start,
            )  # fmt: skip
    return [outcomes[arch] for arch in archs]


# What a kernel costs to build and ship, measured by bench/kernel_build.py on the 2-core CI
# machine (gfx942, Triton 3.6, commit 8f968b7, load average 3-7: "per_module" and
# "wheel_bytes" in bench/results/kernel_build/gfx942.json): the workers' CPU seconds per
# compiled kernel of each module (a matrix-unit kernel costs eight times a norm), and wheel
# bytes per kernel (11.28 MB / 867). attention and attention_bwd: their cases since 69d1d0e
# (a prefill and a decode step per head pattern; the causal backward), 2.27 and 2.71 CPU-s
# per kernel in a build under a load of 6.5-8.4 (bench/results/kernel_build/gfx942_load8.json)
# whose other modules took 1.58x their CPU of the idle run at c666098, so scaled by that.
# Modules not measured take EST_CPU_S_DEFAULT. EST_FIXED_CPU_S is per build (that run's CPU
# outside the compiles): each worker's start and first compile (Triton's specialiser imports
# torch there) and the parent's packaging. Estimates for the dry run only; a real build
# reports what it took.
EST_CPU_S_PER_KERNEL: dict[str, float] = {
    "add_rms_norm": 0.193, "attention": 1.44, "attention_bwd": 1.71, "col_sum": 0.158,
    "kv_cache": 0.176, "layer_norm": 0.199, "linear_cross_entropy": 0.23, "matmul": 0.653,
    "rms_norm": 0.197, "rope": 0.607, "softmax": 0.142, "swiglu": 0.107, "vec_add": 0.065,
}  # fmt: skip
EST_CPU_S_DEFAULT = 0.4
EST_FIXED_CPU_S = 8.0
EST_BYTES_PER_KERNEL = 13_000


def estimate_cpu_s(per_module: dict[str, int]) -> float:
    """CPU seconds a build of these kernel counts takes (EST_CPU_S_PER_KERNEL)."""
    return EST_FIXED_CPU_S + sum(
        n * EST_CPU_S_PER_KERNEL.get(m, EST_CPU_S_DEFAULT) for m, n in per_module.items()
    )


def plan_counts(
    archs: Sequence[str],
    only: Sequence[str] = (),
    variants: Sequence[str] = ("aligned", "ragged"),
    configs_text: str | None = None,
) -> list[dict[str, Any]]:
    """Per arch: the kernels a build compiles (per module), as the workers would list them
    with the table the wheel ships; nothing is compiled."""
    from greta_core import configs
    from greta_core.kernel_wheels.aot import discover, int_kind, variants_of

    rows = []
    for arch in archs:
        table = configs_text if configs_text is not None else configs.shipped_table(arch)
        configs.build_with_table(arch, table)
        try:
            found = discover(arch, only)
        finally:
            configs.build_with_table(arch, None)
        per_module = {
            item.module: sum(
                len(variants_of(int_kind(s), variants, item.module)) for s in item.specs
            )
            for item in found
        }
        errors = {item.module: item.error for item in found if item.error}
        rows.append({"arch": arch, "kernels": sum(per_module.values()),
                     "per_module": per_module, "errors": errors})  # fmt: skip
    return rows


def format_plan_row(row: dict[str, Any], jobs: int = 0) -> str:

    from greta_core.kernel_wheels import buildpool

    jobs = buildpool.resolve_jobs(jobs)
    n = row["kernels"]
    cpu = estimate_cpu_s(row["per_module"])
    seconds = cpu / jobs  # cores to itself; other work on the machine stretches it
    size_mb = n * EST_BYTES_PER_KERNEL / 1e6
    modules = ", ".join(f"{m} {c}" for m, c in sorted(row["per_module"].items()) if c)
    errors = "".join(f"\n  module {m}: {e}" for m, e in row["errors"].items())
    return (
        f"{row['arch']}: {n} kernels, estimated {seconds:.0f} s on {jobs} worker(s) "
        f"({cpu:.0f} CPU-s), ~{size_mb:.1f} MB ({modules}){errors}"
    )


def print_progress(done: int, total: int, res: Any) -> None:
    """One line per finished kernel: bar, k/N, kernel, status, seconds (the first error line)."""
    from greta_install.commandline import progress_line

    status = "ok" if res.ok else "ERROR"
    detail = f"{res.arch} {res.spec} [{res.variant}] {status} {res.seconds:.2f}s"
    print(progress_line(done, total, detail), flush=True)
    if not res.ok:
        print(f"  {(res.error.splitlines() or [''])[0]}", flush=True)


def package_arch(
    arch: str,
    staging: Path,
    out_dir: Path,
    results: Sequence[Any],
    module_errors: list[dict[str, str]],
    variants: list[str],
    table_text: str,
    seconds: float,
) -> dict[str, Any]:
    """Write `arch`'s wheel from its compiled cache entries; no wheel if anything failed."""
    from greta_core.kernel_wheels.aot import environment
    from greta_core.kernel_wheels.host_launchers import SPECS_FILE
    from greta_core.kernel_wheels.wheelbuild import build_wheel, distribution_name, package_name
    from greta_install.version import __version__

    rows = [{k: v for k, v in r.to_row().items() if k != "specialised"} for r in results]
    bad = [r for r in results if not r.ok]
    if bad or module_errors:
        what = [f"{r.spec} [{r.variant}]: {(r.error.splitlines() or [''])[0]}" for r in bad[:5]]
        what += [f"module {e['module']}: {e['error']}" for e in module_errors]
        more = f" (and {len(bad) - 5} more)" if len(bad) > 5 else ""
        return {
            "arch": arch,
            "fatal": f"{len(bad)} kernel(s) failed, no wheel written: " + "; ".join(what) + more,
            "module_errors": module_errors,
            "results": rows,
        }
    files: dict[str, bytes] = {"configs.json": table_text.encode()}
    kernels = []
    launchers: dict[str, dict[str, Any]] = {}
    for res in results:
        entry = collect_entry(staging, res.key)
        files.update({f"precompiled/{name}": data for name, data in entry.items()})
        launcher = launcher_spec(res, entry)
        if launcher:
            launchers.setdefault(launcher["digest"], launcher["spec"])
        kernels.append(
            {
                "spec": res.spec,
                "module": res.module,
                "kernel": res.kernel,
                "variant": res.variant,
                "key": res.key,
                "dir": cache_dir_name(res.key),
                "signature": res.signature,
                "specialised": res.specialised,
                "matrix_instructions": res.matrix_instructions,
                "launcher": launcher["digest"] if launcher else "",
            }
        )
    env = environment()
    manifest = {
        "format": MANIFEST_FORMAT,
        "distribution": distribution_name(arch),
        "package": package_name(arch),
        "version": __version__,
        "arch": arch,
        "triton_version": env["triton"],
        "triton_fingerprint": env["triton_fingerprint"],
        "python": env["python"],
        "machine": env["machine"],
        "build_date": env["date"],
        "source_hash": source_hash(table_text),
        "variants": variants,
        "kernels": kernels,
        # Host launchers described in launchers.json, built by `greta warm`.
        "launchers": sorted(launchers),
    }
    files[SPECS_FILE] = (json.dumps(launchers, indent=1, sort_keys=True) + "\n").encode()
    files["manifest.json"] = (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()
    wheel = build_wheel(out_dir, arch, __version__, files)
    return {
        "arch": arch,
        "wheel": str(wheel),
        "compiled": len(kernels),
        "seconds": round(seconds, 2),
        "module_errors": module_errors,
        "results": rows,
    }


def launcher_spec(res: Any, entry: dict[str, bytes]) -> dict[str, Any] | None:
    """{"digest", "spec"} of a compiled kernel's host launcher (None if not captured)."""
    from greta_core.kernel_wheels.host_launchers import spec_digest

    if not res.launcher:
        return None
    name = cache_dir_name(res.key)
    metadata = json.loads(entry[f"{name}/{res.launcher['kernel']}.json"])
    spec = {**res.launcher, "entry": name}
    return {"digest": spec_digest(spec, metadata), "spec": spec}


def cache_dir_name(key: str) -> str:
    """Triton's cache directory for a key: base32 of the sha256 hex digest."""
    from triton.runtime.cache import _base32

    return _base32(key)


def collect_entry(staging: Path, key: str) -> dict[str, bytes]:
    """The wheel files of one compiled kernel: kept files plus a relocatable group index."""
    name = cache_dir_name(key)
    src = staging / name
    out: dict[str, bytes] = {}
    groups = sorted(src.glob("__grp__*.json"))
    if len(groups) != 1:
        raise AotError(f"cache entry {name}: expected one group file, found {len(groups)}")
    children = json.loads(groups[0].read_text())["child_paths"]
    kept = {}
    for child in children:
        path = src / Path(child).name
        if path.suffix in _KEEP_SUFFIXES and path.is_file():
            kept[child] = child  # relative: resolved against the wheel directory at run time
            out[f"{name}/{path.name}"] = path.read_bytes()
    out[f"{name}/{groups[0].name}"] = json.dumps({"child_paths": kept}).encode()
    return out


def source_hash(table_text: str) -> str:
    """What the wheel was built from (greta_install.install.kernel_build.greta_source_hash)."""
    from greta_install.install.kernel_build import greta_source_hash

    return greta_source_hash(table_text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="greta build-kernels", description=HELP)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
