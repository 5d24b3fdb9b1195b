"""Compile kernel specs on all cores: worker processes, results in spec order.

One arch has hundreds of independent compiles (kernel spec x int specialisation); Triton
compiles one kernel at a time in the calling process, so a build in one process uses one
core. Here each compile is a task for a pool of worker processes:

- workers are *spawned* (never forked from a process whose torch/Triton threads exist)
  and set ``TRITON_INTERPRET=0`` before importing anything, so an interpreter flag in the
  parent cannot turn the kernels into interpreted functions;
- at most ``jobs`` tasks are in flight, so when a worker dies the tasks named in the
  error are the ones it could have been compiling, not ones merely queued;
- results come back as tasks finish (progress), but are returned in task order: what a
  wheel holds never depends on the job count or on which worker was faster;
- workers ignore SIGINT (the parent stops them: Ctrl-C gives one clean interrupt, not a
  traceback per worker) and exit on their own if the parent disappears.

Workers receive tasks by name (module + spec index + spec name), not spec objects:
``@triton.jit`` functions do not pickle, and each worker imports the kernel modules once.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from greta_core.errors import AotError

JOBS_ENV = "GRETA_BUILD_JOBS"


@dataclass(frozen=True)
class Task:
    """One compile: spec number `index` of `module`'s ``aot_specs(arch)``, one variant."""

    arch: str
    module: str
    index: int
    spec: str  # the spec's name, checked in the worker against the index
    variant: str
    cache_dir: str  # the arch's staging directory (Triton cache layout)
    table: str | None = None  # the config table the wheel ships (its blocks are compiled)

    @property
    def label(self) -> str:
        return f"{self.arch} {self.spec} [{self.variant}]"


def resolve_jobs(jobs: int | None = None) -> int:
    """Worker count: ``--jobs N`` when N > 0, else ``GRETA_BUILD_JOBS``, else all usable cores."""
    if jobs and jobs > 0:
        return jobs
    text = os.environ.get(JOBS_ENV, "").strip()
    if text:
        try:
            value = int(text)
        except ValueError:
            raise AotError(f"{JOBS_ENV}={text!r}: expected a whole number of processes") from None
        if value > 0:
            return value
    return usable_cores()


def usable_cores() -> int:
    """Cores this process may run on (a CPU affinity mask or cgroup cpuset counts)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# --- worker side ----------------------------------------------------------------------

_specs_by_module: dict[tuple[str, str, str | None], list[Any]] = {}


def _init_worker(parent: int) -> None:
    # "0", not unset: an environment's greta-env.pth (cpu row) re-sets unset variables.
    os.environ["TRITON_INTERPRET"] = "0"
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()


def _exit_with_parent(parent: int) -> None:
    # A killed parent (SIGKILL, timeout) cannot stop its workers; they stop themselves.
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def discover_specs(
    arch: str, only: Sequence[str], table: str | None = None
) -> list[tuple[str, list[tuple[str, str]], str]]:
    """(module, [(spec name, its `aot.int_kind`)], import error) per kernel module (in a
    worker), with `table` as the arch's config table (the specs' blocks come from it)."""
    from greta_core.kernel_wheels.aot import discover, int_kind

    _use_table(arch, table)

    found = []
    for item in discover(arch, only):
        names = [spec.name for spec in item.specs]
        if len(set(names)) != len(names):
            dupes = sorted({n for n in names if names.count(n) > 1})
            raise AotError(f"module {item.module}: spec names repeat for {arch}: {dupes}")
        found.append((item.module, [(s.name, int_kind(s)) for s in item.specs], item.error))
    return found


def _use_table(arch: str, table: str | None) -> None:
    from greta_core import configs

    configs.build_with_table(arch, table)


def compile_task(task: Task) -> Any:
    """Compile one task (in a worker); returns aot.CompileResult."""
    from greta_core.kernel_wheels.aot import compile_spec, compiling_for, discover

    _use_table(task.arch, task.table)
    key = (task.arch, task.module, task.table)
    if key not in _specs_by_module:
        _specs_by_module[key] = discover(task.arch, [task.module])[0].specs
    spec = _specs_by_module[key][task.index]
    if spec.name != task.spec:
        raise AotError(f"spec {task.index} of {task.module} is {spec.name!r}, not {task.spec!r}")
    with compiling_for(task.arch, task.cache_dir):
        return compile_spec(spec, task.module, task.arch, task.variant)


# --- parent side ----------------------------------------------------------------------


@contextlib.contextmanager
def worker_pool(jobs: int) -> Iterator[ProcessPoolExecutor]:
    """A pool of `jobs` spawned workers, stopped on the way out (Ctrl-C included)."""
    ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(
        max_workers=jobs, mp_context=ctx, initializer=_init_worker, initargs=(os.getpid(),)
    )
    try:
        yield pool
    except BaseException:
        stop_workers(pool)
        raise
    else:
        pool.shutdown(wait=True)


def stop_workers(pool: ProcessPoolExecutor) -> None:
    """Cancel what is queued and terminate the workers now (their compiles are abandoned)."""
    # Python < 3.14 has no public way to stop a pool's workers: use its process table.
    procs = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        with contextlib.suppress(Exception):
            proc.terminate()
    for proc in procs:
        with contextlib.suppress(Exception):
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()


def failed_result(task: Task, error: str) -> Any:
    from greta_core.kernel_wheels.aot import CompileResult

    return CompileResult(
        spec=task.spec,
        module=task.module,
        kernel="",
        arch=task.arch,
        variant=task.variant,
        ok=False,
        seconds=0.0,
        error=error,
    )


def compile_all(
    pool: ProcessPoolExecutor,
    tasks: Sequence[Task],
    jobs: int,
    *,
    progress: Callable[[int, int, Any], None] | None = None,
    work: Callable[[Task], Any] = compile_task,
) -> list[Any]:
    """Compile `tasks` on `pool`; CompileResults in task order, failures as ok=False results.

    `progress(done, total, result)` is called as each task finishes. A task whose worker
    raised gets its exception as the error; when a worker process dies, the tasks in
    flight name it and the ones not started are reported as not compiled.
    """
    results: list[Any] = [None] * len(tasks)
    pending: dict[Future[Any], int] = {}
    next_task = 0
    done = 0
    broken = ""

    def finish(index: int, result: Any) -> None:
        nonlocal done
        results[index] = result
        done += 1
        if progress:
            progress(done, len(tasks), result)

    while next_task < len(tasks) or pending:
        while not broken and next_task < len(tasks) and len(pending) < jobs:
            try:
                pending[pool.submit(work, tasks[next_task])] = next_task
            except BrokenProcessPool:
                broken = broken or "a build worker process died"
                break
            next_task += 1
        if broken and not pending:
            break
        in_flight = [tasks[i].label for i in sorted(pending.values())]
        finished, _ = wait(pending, return_when=FIRST_COMPLETED)
        for future in sorted(finished, key=pending.__getitem__):
            index = pending.pop(future)
            task = tasks[index]
            try:
                result = future.result()
            except BrokenProcessPool:
                which = in_flight[0] if len(in_flight) == 1 else "one of " + ", ".join(in_flight)
                broken = f"a build worker process died while compiling {which}"
                result = failed_result(task, broken)
            except Exception as exc:
                result = failed_result(task, f"{type(exc).__name__}: {exc}".strip()[:2000])
            finish(index, result)
    for index in range(next_task, len(tasks)):
        finish(index, failed_result(tasks[index], f"not compiled: {broken}"))
    return results
