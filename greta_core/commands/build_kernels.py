"""`greta build-kernels`: one kernel wheel per GPU arch, built on any machine (no GPU needed).

Each wheel (``greta_kernels_<arch>-<version>-py3-none-any.whl``) holds the arch's launch
config table (``configs.json``), the Triton cache entries of every kernel spec compiled
for the arch with the installed Triton (``precompiled/<key>/``), and ``manifest.json``
(kernels and specialisations covered, arch, Triton version and build fingerprint, build
date, source hash) and ``launchers.json``, what Triton's host launcher of each kernel
signature is built from (built on the user's machine by ``greta warm``). Each arch builds in its own process (``--jobs``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from greta_core.errors import AotError, ConfigError

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
    parser.add_argument("--jobs", type=int, default=0, help="parallel archs (default: CPU count)")
    parser.add_argument("--report", type=Path, help="write the AOT report (JSON) here")


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
    start = time.perf_counter()
    outcomes = build_all(
        archs, args.out, only=only, variants=variants, configs_text=configs_text, jobs=args.jobs
    )
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
) -> list[dict[str, Any]]:
    """Build one wheel per arch, each in a fresh process (Triton's interpreter flag and
    JIT state must not leak in); returns one outcome dict per arch, in `archs` order."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    jobs = jobs or min(len(archs), os.cpu_count() or 1)
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        max_workers=max(1, jobs), mp_context=ctx, initializer=_clean_env
    ) as pool:
        futures = [
            pool.submit(build_arch, arch, str(out_dir), list(only), list(variants), configs_text)
            for arch in archs
        ]
        outcomes = []
        for arch, future in zip(archs, futures, strict=True):
            try:
                outcomes.append(future.result())
            except Exception as exc:
                outcomes.append({"arch": arch, "fatal": f"{type(exc).__name__}: {exc}"})
    return outcomes


def _clean_env() -> None:
    # "0", not unset: an environment's greta-env.pth (cpu row) re-sets unset variables.
    os.environ["TRITON_INTERPRET"] = "0"


def build_arch(
    arch: str,
    out_dir: str,
    only: Sequence[str] = (),
    variants: Sequence[str] = ("aligned", "ragged"),
    configs_text: str | None = None,
) -> dict[str, Any]:
    """Compile every spec for `arch` and write its wheel (runs in a worker process)."""
    from greta_core.kernel_wheels.aot import run_aot
    from greta_core.kernel_wheels.host_launchers import SPECS_FILE
    from greta_core.kernel_wheels.wheelbuild import build_wheel, distribution_name, package_name
    from greta_install.version import __version__

    start = time.perf_counter()
    table_text = configs_text if configs_text is not None else shipped_table(arch)
    json.loads(table_text)  # a broken table must fail the build, not the user's run
    with tempfile.TemporaryDirectory(prefix=f"greta-kernels-{arch}-") as staging:
        aot = run_aot([arch], staging, only=only, variants=variants)
        files: dict[str, bytes] = {"configs.json": table_text.encode()}
        kernels = []
        launchers: dict[str, dict[str, Any]] = {}
        for res in aot.results:
            if not res.ok:
                continue
            entry = collect_entry(Path(staging), res.key)
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
    env = aot.environment
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
        "variants": list(variants),
        "kernels": kernels,
        # Host launchers described in launchers.json, built by `greta warm`.
        "launchers": sorted(launchers),
    }
    files[SPECS_FILE] = (json.dumps(launchers, indent=1, sort_keys=True) + "\n").encode()
    files["manifest.json"] = (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()
    wheel = build_wheel(Path(out_dir), arch, __version__, files)
    return {
        "arch": arch,
        "wheel": str(wheel),
        "compiled": len(kernels),
        "seconds": round(time.perf_counter() - start, 2),
        "module_errors": aot.module_errors,
        "results": [
            {k: v for k, v in r.to_row().items() if k != "specialised"} for r in aot.results
        ],
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


def shipped_table(arch: str) -> str:
    """The arch's config table shipped in greta_core (never an installed wheel's); ConfigError
    when neither it nor the default table is there."""
    from importlib import resources

    tables = resources.files("greta_core.configs").joinpath("tables")
    for name in (arch, "default"):
        candidate = tables.joinpath(f"{name}.json")
        if candidate.is_file():
            return candidate.read_text()
    raise ConfigError(f"no config table for {arch}")


def source_hash(table_text: str) -> str:
    """sha256 over the kernel sources and the shipped table: what the code was built from."""
    from importlib import resources

    digest = hashlib.sha256()
    kernels = resources.files("greta_core.kernels")
    for item in sorted(kernels.iterdir(), key=lambda p: p.name):
        if item.name.endswith(".py"):
            digest.update(item.name.encode() + b"\0" + item.read_bytes() + b"\0")
    digest.update(table_text.encode())
    return digest.hexdigest()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="greta build-kernels", description=HELP)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
