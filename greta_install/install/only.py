"""`greta install --only kernels,smoke`: the post-install steps, against the environment
as it is (torch/triton/jax installed by other means, e.g. a preinstalled GPU image).

kernels: reuse the cached kernel wheel for this arch + installed Triton + GRETA source,
or build it here, then install it (offline, hash-checked). smoke: the smoke test. On the
cpu target there is no kernel wheel (Triton runs in its interpreter): said, not an error.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

STEPS = ("kernels", "smoke")


def run(args: argparse.Namespace) -> int:
    from greta_install.environment.tools import find_uv
    from greta_install.install import kernel_build, smoke

    wanted = [s.strip() for s in (args.only or "").split(",") if s.strip()]
    unknown = [s for s in wanted if s not in STEPS]
    if unknown or not wanted:
        print(
            f"greta install --only: unknown step(s) {', '.join(unknown) or '(none)'}; "
            f"choose from {', '.join(STEPS)}",
            file=sys.stderr,
        )
        return 2
    python = args.python or sys.executable
    target, arch = args.target, args.arch
    if target is None or (arch is None and target != "cpu"):
        try:
            from greta_install.detection.detect import detect
            from greta_install.detection.system_view import open_view

            det = detect(open_view(args.snapshot))
            target = target or det.target
            arch = arch or det.arch
        except Exception as exc:  # detection failing is reported, not raised
            print(
                f"greta install --only: detection failed ({exc}); pass --target/--arch",
                file=sys.stderr,
            )
            return 2

    def log(message: str) -> None:
        print(message, file=sys.stderr if args.json else sys.stdout, flush=True)

    results: dict[str, Any] = {}
    code = 0
    if "kernels" in wanted:
        if target == "cpu" or not arch:
            log(
                "kernels: none for the cpu target: Triton kernels run in Triton's interpreter, "
                "there is nothing to precompile"
            )
            results["kernels"] = None
        elif args.no_build_kernels:
            log("kernels: skipped (--no-build-kernels)")
        else:
            try:
                built = kernel_build.build_or_reuse(python, arch, log=log)
                kernel_build.install_wheel(
                    python, built.path, log, uv=find_uv() if not _has_pip(python) else None,
                    arch=arch,
                )  # fmt: skip
                results["kernels"] = {
                    "wheel": built.path.name,
                    "sha256": built.sha256,
                    "cached": built.cached,
                    "seconds": round(built.seconds, 1),
                    "launchers_built": _warm(python, log),
                }
            except kernel_build.KernelBuildError as exc:
                log(f"kernels: FAILED: {exc}")
                results["kernels"] = {"error": str(exc)}
                code = 1
    if "smoke" in wanted:
        mode = smoke.default_mode(target)
        report = smoke.run_smoke(python, mode, log=log)
        results["smoke"] = report.to_json()
        if report.ok:
            log(f"smoke test passed in {report.seconds:.1f}s")
        else:
            log(f"smoke test FAILED: {report.failure_message()}")
            code = 1
    if args.json:
        print(json.dumps(results, indent=2))
    return code


def _has_pip(python: str) -> bool:
    from greta_install.environment.tools import has_pip

    return has_pip(python)


def _warm(python: str, log: Any) -> bool:
    """`greta warm` in the environment: the wheel's host launchers, so a first call runs no
    C compiler (optional, as in `greta install`)."""
    import subprocess

    from greta_install.commandline import NEUTRAL_CWD, python_module

    log("building the kernel wheel's host launchers (greta warm)")
    try:
        proc = subprocess.run(
            [*python_module(python, "greta"), "warm"],
            capture_output=True,
            text=True,
            timeout=900,
            stdin=subprocess.DEVNULL,
            cwd=NEUTRAL_CWD,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log(f"warning: greta warm did not finish ({exc}); the first kernel calls build them")
        return False
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        log(f"warning: greta warm failed ({tail[0]}); the first kernel calls build them")
        return False
    return True
