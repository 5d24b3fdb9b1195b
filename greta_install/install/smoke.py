"""Prove an environment runs before calling an install a success.

The test (smoke_child.py) runs in a subprocess of the target environment's Python,
with a timeout: a crash, a hang or a GPU that vanished cannot take the installer with
it. This module only starts it and reads its JSON lines; it imports nothing heavy.
Each failed step maps to the doctor check that explains it and the usual fix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from greta_install.environment.ptxas import UNSUPPORTED_PTX, export_line, site_dirs_of, wheel_ptxas

CHILD = Path(__file__).with_name("smoke_child.py")
GPU_TIMEOUT_S = 600.0  # first Triton compiles on a cold GPU machine
CPU_TIMEOUT_S = 180.0

# What a broken torch build says on its first kernel: no code for this GPU's arch.
NO_KERNEL_FOR_ARCH = ("invalid device function", "no kernel image is available")
ARCH_FIX = (
    "torch.arch (torch wheel carries the device's arch)",
    "greta doctor; greta install picks a torch build that carries this GPU's arch "
    "(or refuses a known-bad one); greta install --target cpu runs on the CPU",
)
NUMERIC = (
    "torch.arch (torch wheel carries the device's arch)",
    "greta doctor   # this torch computes wrong numbers on this GPU (a build without its "
    "arch, an override to a foreign arch, or a known-bad arch such as gfx1033); "
    "greta install --target cpu runs on the CPU",
)

# XLA assembled Triton's PTX with an older ptxas than the one the environment's wheels bring.
OLD_PTXAS = (
    "cuda.ptxas (the ptxas XLA finds is not older than the NVIDIA wheels' one)",
    "XLA assembles jax-triton's kernels with the first ptxas it finds, here one older "
    "than Triton's PTX; the environment's nvidia-cuda-nvcc wheel has a newer one",
)

# step -> (doctor check that explains a failure, the usual fix)
DIAGNOSIS: dict[str, tuple[str, str]] = {
    "torch": ("torch.import / torch.gpu", "greta doctor   # names why torch fails or sees no GPU"),
    "matmul": NUMERIC,
    "chain": NUMERIC,
    "training": NUMERIC,
    "gradcheck": NUMERIC,
    "triton": ("triton.*", "greta doctor   # one `triton` distribution, the one torch pins"),
    "sdpa": ("torch.arch", "greta doctor"),
    "greta-raw": ("kernel_wheel.*", "greta doctor; greta build-kernels --install"),
    "greta-torch": ("kernel_wheel.*", "greta doctor; greta build-kernels --install"),
    "jax": ("jax.*", "greta doctor   # jax, jaxlib and the GPU plugin must match"),
    "greta-jax": ("jax.jax_triton", "greta doctor"),
}


@dataclass(frozen=True)
class Step:
    name: str
    status: str  # "passed" | "failed" | "skipped" (never a pass: note says why)
    seconds: float
    detail: Any = None
    error: str | None = None
    note: str | None = None

    @property
    def failed(self) -> bool:
        return self.status not in ("passed", "skipped")


@dataclass
class SmokeReport:
    mode: str  # "gpu" | "cpu"
    steps: list[Step] = field(default_factory=list)
    returncode: int | None = None
    timed_out: bool = False
    seconds: float = 0.0
    stderr_tail: str = ""
    planned: list[str] = field(default_factory=list)  # the steps the child said it would run
    # the environment's NVIDIA wheel ptxas folder, looked up when a step failed on XLA's
    # older ptxas ("Unsupported .version"): the fix puts it first on PATH
    ptxas_dir: str | None = None

    @property
    def old_ptxas(self) -> bool:
        return any(s.failed and UNSUPPORTED_PTX in (s.error or "") for s in self.steps)

    @property
    def missing(self) -> list[str]:
        """Planned steps the child never reported (it crashed or was killed first)."""
        done = {s.name for s in self.steps}
        return [name for name in self.planned if name not in done]

    @property
    def ok(self) -> bool:
        """Fails closed: every planned step reported, none failed, at least one passed."""
        return (
            not self.timed_out
            and self.returncode == 0
            and bool(self.planned)
            and not self.missing
            and not any(s.failed for s in self.steps)
            and any(s.status == "passed" for s in self.steps)
        )

    @property
    def failed(self) -> Step | None:
        return next((s for s in self.steps if s.failed), None)

    def failure_message(self) -> str:
        """Which step failed, the doctor check that explains it, and the fix."""
        if self.ok:
            return ""
        if self.timed_out:
            last = self.steps[-1].name if self.steps else "start-up"
            return (
                f"the smoke test did not finish in time (last step done: {last}); doctor: "
                "torch.import; fix: greta doctor --probe-timeout 600"
            )
        step = self.failed
        if step is None:
            tail = self.stderr_tail.strip().splitlines()[-1:] or ["no output"]
            where = f"before step '{self.missing[0]}'" if self.missing else "before reporting"
            return (
                f"the smoke test crashed {where} (exit {self.returncode}): {tail[0]}; "
                "doctor: torch.import; fix: greta doctor"
            )
        check, fix = DIAGNOSIS.get(step.name, ("", "greta doctor"))
        if any(words in (step.error or "") for words in NO_KERNEL_FOR_ARCH):
            check, fix = ARCH_FIX
        if UNSUPPORTED_PTX in (step.error or ""):
            check, fix = (
                OLD_PTXAS[0],
                (
                    f"{export_line(self.ptxas_dir)}   # {OLD_PTXAS[1]}, then run it again"
                    if self.ptxas_dir
                    else f"greta doctor   # {OLD_PTXAS[1]}; cuda.ptxas names the folder"
                ),
            )
        return f"smoke test step '{step.name}' failed: {step.error}; doctor: {check}; fix: {fix}"

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "ok": self.ok,
            "timed_out": self.timed_out,
            "returncode": self.returncode,
            "seconds": round(self.seconds, 2),
            "failed": self.failed.name if self.failed else None,
            "missing": self.missing,
            "message": self.failure_message() or None,
            "counts": {
                status: sum(s.status == status for s in self.steps)
                for status in ("passed", "failed", "skipped")
            },
            "steps": [
                {
                    "step": s.name,
                    "status": s.status,
                    "seconds": s.seconds,
                    "detail": s.detail,
                    "error": s.error,
                    "note": s.note,
                }
                for s in self.steps
            ],
        }


def parse_line(line: str) -> Step | list[str] | None:
    """One line of the child: a Step, the plan (list of step names), or None for noise."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        data = json.loads(line)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    plan = data.get("plan")
    if isinstance(plan, list) and all(isinstance(name, str) for name in plan):
        return plan
    if not isinstance(data.get("step"), str):
        return None
    status = data.get("status")
    return Step(
        data["step"],
        status if status in ("passed", "failed", "skipped") else "failed",
        float(data.get("seconds") or 0.0),
        data.get("detail"),
        data.get("error") or (None if status in ("passed", "skipped") else f"status {status!r}"),
        data.get("note"),
    )


def parse_output(stdout: str) -> tuple[list[str], list[Step]]:
    """The plan and the steps a child reported; lines that are neither are ignored."""
    plan: list[str] = []
    steps: list[Step] = []
    for line in stdout.splitlines():
        item = parse_line(line)
        if isinstance(item, Step):
            steps.append(item)
        elif isinstance(item, list):
            plan = item
    return plan, steps


def child_env(mode: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if mode == "cpu":
        # Triton has no CPU backend: the CPU row runs its kernels in the interpreter.
        env["TRITON_INTERPRET"] = "1"
        env.setdefault("JAX_PLATFORMS", "cpu")
    else:
        env.pop("TRITON_INTERPRET", None)
    return env


def run_smoke(
    python: str,
    mode: str,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    log: Callable[[str], None] | None = None,
) -> SmokeReport:
    """Run the smoke test in `python`; never raises for a failing environment.

    The child runs isolated (-I: no PYTHON* variables, no user site, not its own folder on
    the path) from an empty folder, so it imports what the environment itself holds."""
    timeout = timeout or (GPU_TIMEOUT_S if mode == "gpu" else CPU_TIMEOUT_S)
    report = SmokeReport(mode)
    start = time.perf_counter()
    argv = [python, "-I", str(CHILD), mode]
    # stderr goes to a file: a chatty child must never block on a full pipe.
    errfile = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")  # noqa: SIM115 (closed on every path below)
    workdir = tempfile.TemporaryDirectory(prefix="greta-smoke-")  # an empty cwd, cleaned below
    try:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=errfile,
            stdin=subprocess.DEVNULL,
            text=True,
            env=child_env(mode, env),
            cwd=workdir.name,
            start_new_session=True,
        )
    except OSError as exc:
        errfile.close()
        workdir.cleanup()
        report.returncode = -1
        report.stderr_tail = f"could not start {python}: {exc}"
        return report
    try:
        assert proc.stdout is not None
        deadline = start + timeout
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            left = deadline - time.perf_counter()
            if left <= 0:
                raise subprocess.TimeoutExpired(argv, timeout)
            if not sel.select(timeout=min(left, 1.0)):
                if proc.poll() is not None:
                    break
                continue
            line = proc.stdout.readline()
            if not line:
                break
            item = parse_line(line)
            if isinstance(item, list):
                report.planned = item
            elif isinstance(item, Step):
                report.steps.append(item)
                if log:
                    log(_log_line(item))
        proc.wait(timeout=max(1.0, deadline - time.perf_counter()))
    except subprocess.TimeoutExpired:
        report.timed_out = True
        _kill(proc)
    finally:
        errfile.seek(0)
        report.stderr_tail = errfile.read()[-4000:]
        errfile.close()
        workdir.cleanup()
    report.returncode = proc.returncode
    if report.old_ptxas:
        found = wheel_ptxas(site_dirs_of(python))
        report.ptxas_dir = str(found.parent) if found else None
    report.seconds = time.perf_counter() - start
    return report


def _log_line(step: Step) -> str:
    mark = {"passed": "passed", "skipped": "skipped"}.get(step.status, "FAILED")
    why = step.note if step.status == "skipped" else step.error if step.failed else None
    return f"  smoke {step.name}: {mark} ({step.seconds:.1f}s)" + (f": {why}" if why else "")


def _kill(proc: subprocess.Popen[str]) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (OSError, ProcessLookupError):
        proc.kill()
    proc.wait()


def default_mode(target: str | None) -> str:
    return "cpu" if target in (None, "cpu") else "gpu"


if __name__ == "__main__":  # pragma: no cover - manual use
    result = run_smoke(sys.executable, sys.argv[1] if len(sys.argv) > 1 else "cpu", log=print)
    print(json.dumps(result.to_json(), indent=1))
