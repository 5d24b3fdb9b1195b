"""`greta smoke`: prove this environment runs and computes right (the last step of
`greta install`).

Runs alone too, e.g. after torch was installed by other means: torch import and a first
kernel on the GPU; the numeric gate (bf16/fp32 matmul, an elementwise/reduction chain, a
tiny MLP trained by SGD and an fp64 gradcheck, each against the CPU within tolerances
derived from the dtype and the reduction length); one Triton kernel compiled and run,
SDPA forward and backward, one GRETA op through each binding (raw Triton,
torch.ops.greta, greta_core.jax) against its reference and a jax op on the device. On the
CPU row the numeric checks run on the CPU only and say so (skipped, not passed). Exit 0
only if no step failed. `--json` reports every step with its numbers.
"""

from __future__ import annotations

import argparse
import json
import sys

from greta_install.commandline import interpreter_path

HELP = (
    "Smoke-test this environment: torch, the numeric gate against the CPU, Triton, GRETA ops, jax."
)


def positive_seconds(text: str) -> float:
    """A positive, finite number of seconds (argparse turns ValueError into a usage error)."""
    value = float(text)
    if not 0 < value < float("inf"):
        raise ValueError(text)
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--python",
        type=interpreter_path,
        help="interpreter of the environment to test (default: this one)",
    )
    parser.add_argument(
        "--mode",
        choices=("auto", "gpu", "cpu"),
        default="auto",
        help="gpu: every step on the GPU; cpu: the CPU row's equivalents (default: from detection)",
    )
    parser.add_argument(
        "--timeout", type=positive_seconds, help="seconds before the test is killed (more than 0)"
    )
    parser.add_argument("--json", action="store_true", help="machine-readable report")


def _auto_mode() -> str:
    from greta_install.install.smoke import default_mode

    try:
        from greta_install.detection.detect import detect
        from greta_install.detection.system_view import open_view

        return default_mode(detect(open_view(None)).target)
    except Exception:  # detection must never stop the smoke test: test the CPU path
        return "cpu"


def run(args: argparse.Namespace) -> int:
    from greta_install.install.smoke import run_smoke

    mode = _auto_mode() if args.mode == "auto" else args.mode
    python = args.python or sys.executable

    def log(message: str) -> None:
        print(message, file=sys.stderr if args.json else sys.stdout, flush=True)

    log(f"smoke test ({mode}) in {python}")
    report = run_smoke(python, mode, args.timeout, log=log)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    elif report.ok:
        skipped = [s.name for s in report.steps if s.status == "skipped"]
        log(
            f"smoke test passed in {report.seconds:.1f}s"
            + (f" ({len(skipped)} skipped: {', '.join(skipped)})" if skipped else "")
        )
        timing = next((s.detail for s in report.steps if s.name == "greta-torch"), None)
        if isinstance(timing, dict) and "first_ms" in timing:
            log(
                f"  first torch.ops.greta.rms_norm call {timing['first_ms']:.2f} ms, "
                f"warm {timing['warm_ms']:.2f} ms"
            )
    else:
        log(f"smoke test FAILED: {report.failure_message()}")
    return 0 if report.ok else 1
