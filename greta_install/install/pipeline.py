"""`greta install` as a pipeline of named steps: plan -> stage -> commit -> post-commit -> finish.

- plan (`prepare`): gather the facts at the edge (matrix, lock, detection, interpreter,
  installer, kernel-wheel lookup) and build the pure `InstallPlan`. Changes nothing.
- stage: download and verify every file into a private, locked staging folder
  (greta_install.install.installer). Changes nothing in the environment.
- commit: under the environment lock, journal the intent (greta_install.install.transaction),
  then run the offline install of the staged files.
- post-commit: the `PostCommitStep`s of greta_install.install.steps, in order (environment fixes,
  ... , host launchers). A required step that fails undoes the whole install.
- finish: mark the journal done and remove the backup and the stage.

Any failure or signal after the commit began is undone through the journal; a kill is
undone by the next run (`transaction.recover`). Every message says the final state.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from greta_install import commandline
from greta_install.commandline import STAGE
from greta_install.environment.wheelfiles import Scheme
from greta_install.errors import GretaError
from greta_install.install import transaction
from greta_install.install.installer import Downloader, InstallError, StageResult
from greta_install.install.transaction import Interrupted, Transaction, TransactionError
from greta_install.plan.install_plan import InstallPlan

Log = Callable[[str], None]


class InstallFailed(GretaError):
    """The install did not happen; `message` states the environment's final state."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


class StepFailed(GretaError):
    """Raised by a post-commit step: the install is undone (for a required step)."""

    def __init__(self, step: str, reason: str) -> None:
        super().__init__(f"{step}: {reason}")
        self.step = step
        self.reason = reason


# --- the request and the plan step ------------------------------------------------------


@dataclass(frozen=True)
class InstallRequest:
    """What the user asked for (the command line, parsed)."""

    target: str | None = None
    arch: str | None = None
    python: str | None = None
    installer: str | None = None
    dry_run: bool = False
    allow_unverified: bool = False
    allow_http: bool = False
    force_target: bool = False
    kernel_wheels: str | None = None
    snapshot: str | None = None
    lock: str | None = None
    # which row of the target ("current", "therock", "previous"); None: the plan routes
    # the arch to the first row whose torch build carries it (greta_install/locks/routing.py)
    row: str | None = None
    allow_known_bad: bool = False  # install on an arch the arch table marks known-bad
    strict: bool = False  # refuse files without a lock hash (no trust on first use)
    from_record: str | None = None  # another install's hash record (cluster installs)
    build_kernels: bool = True  # build the kernel wheel here when nobody serves it
    smoke: bool = True  # smoke-test the environment before calling the install done
    keep_failed: bool = False  # keep an environment whose smoke test failed
    wheelhouse: str | None = None  # --save-wheelhouse DIR


@dataclass
class Prepared:
    """The outcome of the plan step: everything later steps need, nothing changed yet."""

    request: InstallRequest
    plan: InstallPlan
    downloader: Downloader
    uv: str | None
    executable: str | None  # None when planning for a Python version only (dry run)
    steps: list[PostCommitStep]
    record: Any = None  # greta_install.install.hashrecord.HashRecord: hashes trusted so far


# --- post-commit steps ------------------------------------------------------------------


@dataclass
class CommitContext:
    """What a post-commit step may use. Every change to the environment goes through it
    (`install_wheels`, `track_file`), so the journal can undo it."""

    plan: InstallPlan
    executable: str
    site_packages: Path
    scheme: Scheme
    staged: StageResult
    stage_dir: Path
    log: Log
    txn: Transaction
    uv: str | None
    allow_http: bool = False
    results: dict[str, Any] = field(default_factory=dict)  # step name -> JSON-able result
    env: dict[str, str] | None = None  # environment of children (None: os.environ)
    lock_fd: int | None = None  # the environment lock, passed on to installer children

    def track_file(self, path: Path) -> None:
        """Call before creating, overwriting or deleting `path` in the environment."""
        self.txn.track_file(path)

    def install_wheels(self, wheels: Sequence[Path], hashes: Sequence[str]) -> None:
        """Install more wheels (e.g. one built after torch is in) inside this transaction.

        `hashes` are their "sha256:<hex>"; the installer runs offline with
        --require-hashes. InstallError when it fails (the pipeline then undoes all)."""
        folder = Path(tempfile.mkdtemp(prefix="extra-", dir=self.stage_dir))
        lines = []
        for wheel, digest in zip(wheels, hashes, strict=True):
            from packaging.utils import parse_wheel_filename

            name, version, _, _ = parse_wheel_filename(wheel.name)
            os.link(wheel, folder / wheel.name) if _same_fs(wheel, folder) else _copy(
                wheel, folder / wheel.name
            )
            lines.append(f"{name}=={version} --hash={digest}")
        (folder / "requirements.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        self.txn.add_wheels([folder / w.name for w in wheels])
        argv = commandline.install_argv(self.plan, str(folder), self.uv)
        run_installer(argv, folder, self.log, self.env, self.lock_fd)

    def python(self, args: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
        """Run the environment's Python isolated (-I), from the stage folder, no stdin."""
        return subprocess.run(
            [self.executable, commandline.ISOLATED, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
            cwd=self.stage_dir,
            env=self.env,
        )


def _same_fs(a: Path, b: Path) -> bool:
    try:
        return a.stat().st_dev == b.stat().st_dev
    except OSError:
        return False


def _copy(a: Path, b: Path) -> None:
    import shutil

    shutil.copyfile(a, b)


class PostCommitStep(Protocol):
    """One step after the offline install. Declared in greta_install.install.steps.POST_COMMIT_STEPS.

    name: shown in logs, --dry-run and error messages ("env-fixes", "smoke-test").
    required: True -> a StepFailed undoes the whole install (byte-identical environment);
              False -> a StepFailed is reported as a warning and the install stands.
    """

    name: str
    required: bool

    def applies(self, plan: InstallPlan) -> bool: ...

    def describe(self, plan: InstallPlan) -> list[str]:
        """What --dry-run shows for this step (commands or one-line descriptions)."""
        ...

    def run(self, ctx: CommitContext) -> None:
        """Do the step; raise StepFailed(self.name, reason) to fail it."""
        ...


# --- dry run ----------------------------------------------------------------------------


def describe(prepared: Prepared) -> list[dict[str, Any]]:
    """Every step a real install runs, in order, with its commands (for --dry-run)."""
    plan = prepared.plan
    out: list[dict[str, Any]] = [
        {"step": "plan", "commands": []},
        {"step": "stage", "commands": [commandline.shell(c) for c in plan.commands["stage"]]},
        {
            "step": "commit",
            "commands": [commandline.shell(commandline.install_argv(plan, STAGE, prepared.uv))],
        },
    ]
    for step in prepared.steps:
        out.append({"step": step.name, "required": step.required, "commands": step.describe(plan)})
    out.append({"step": "finish", "commands": []})
    return out


# --- execution --------------------------------------------------------------------------


@dataclass
class Outcome:
    staged: StageResult
    results: dict[str, Any]
    recovered: list[str]
    warnings: list[str]


def run_installer(
    argv: list[str],
    cwd: Path,
    log: Log,
    env: dict[str, str] | None = None,
    lock_fd: int | None = None,
) -> None:
    """Run pip/uv; it dies with GRETA (PR_SET_PDEATHSIG), holds the environment lock too
    (so a child that outlives GRETA still keeps other installs out), never reads the
    terminal."""
    run_env = dict(os.environ if env is None else env)
    run_env["TMPDIR"] = str(cwd)  # its temporary files go where the stage cleanup finds them
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
        env=run_env,
        start_new_session=True,  # a terminal Ctrl-C reaches GRETA, which decides
        preexec_fn=_die_with_parent,
        pass_fds=(lock_fd,) if lock_fd is not None else (),
    )
    try:
        out, err = proc.communicate()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    if proc.returncode != 0:
        raise InstallError(
            "install",
            f"the offline install from verified files failed ({Path(argv[0]).name} exit "
            f"{proc.returncode}): {(err or out).strip()[-1500:]}",
        )


def _die_with_parent() -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        pass


def execute(
    prepared: Prepared,
    log: Log,
    *,
    env: dict[str, str] | None = None,
    stage_root: str | None = None,
) -> Outcome:
    """stage -> commit -> post-commit steps -> finish. InstallFailed states the outcome."""
    from greta_install.environment.tools import scheme_of
    from greta_install.install import installer

    plan = prepared.plan
    executable = prepared.executable
    assert executable is not None
    if plan.blockers:
        raise InstallFailed("; ".join(plan.blockers))
    try:
        scheme = scheme_of(executable, plan.python_version)
    except (ValueError, OSError) as exc:
        raise InstallFailed(str(exc), 2) from None
    site = scheme.purelib
    parent = Path(stage_root or tempfile.gettempdir())
    warnings: list[str] = []
    with transaction.interruptible():
        lock = transaction.EnvLock(site)
        try:
            lock.acquire(log)
        except TransactionError as exc:
            raise InstallFailed(str(exc)) from None
        except Interrupted as exc:
            raise InstallFailed(
                "interrupted while waiting for another install: nothing was installed; "
                "the environment is unchanged.",
                128 + exc.signum,
            ) from None
        stage_fd = None
        stage: Path | None = None
        try:
            try:
                recovered = transaction.recover(site, log, scheme.roots)
            except transaction.JournalRefused as exc:
                raise InstallFailed(str(exc), 2) from None
            except OSError as exc:
                raise InstallFailed(
                    f"an earlier, interrupted install left {site / transaction.TXN_DIR} and "
                    f"undoing it failed ({exc}); nothing was installed. Fix the cause and run "
                    "greta install again (it retries the undo)"
                ) from None
            transaction.sweep_stale_stages(parent, log)
            stage, stage_fd = _make_stage(parent)
            try:
                staged = installer.stage_plan(
                    plan,
                    stage,
                    prepared.downloader,
                    log,
                    env,
                    prepared.request.allow_http,
                    record=prepared.record,
                )
                installer.write_stage_requirements(plan, staged)
            except InstallError as exc:
                raise InstallFailed(
                    f"failed: {exc.package}: {exc.reason}. Nothing was installed; "
                    "the environment is unchanged."
                ) from None
            except Interrupted as exc:
                raise InstallFailed(
                    "interrupted while staging: nothing was installed; the environment is unchanged.",
                    128 + exc.signum,
                ) from None
            except Exception as exc:  # e.g. the temporary directory's disk is full
                raise InstallFailed(
                    f"failed while staging: {exc.__class__.__name__}: {exc}. Nothing was "
                    "installed; the environment is unchanged."
                ) from None
            results = _commit(prepared, staged, stage, scheme, lock, log, env, warnings)
            _compile_bytecode(executable, site, list(staged.files.values()), log, warnings)
            return Outcome(staged, results, recovered, warnings)
        finally:
            with transaction.critical():
                if stage is not None:
                    import shutil

                    shutil.rmtree(stage, ignore_errors=True)
                if stage_fd is not None:
                    os.close(stage_fd)
                lock.release()


def _compile_bytecode(
    executable: str, site: Path, wheels: Sequence[Path], log: Log, warnings: list[str]
) -> None:
    """After the commit (the install is complete and stays so whatever happens here)."""
    import time

    from greta_install.environment import bytecode

    log("compiling bytecode for the installed packages (first imports stay fast)")
    start = time.monotonic()
    try:
        why_not = bytecode.compile_installed(executable, bytecode.installed_sources(wheels, site))
    except (Interrupted, KeyboardInterrupt):
        # The install is complete: a stop now only leaves bytecode for the first imports.
        why_not = "interrupted; the install is complete, imports compile what is missing"
    if why_not:
        warnings.append(f"bytecode: {why_not}")
        log(f"warning: bytecode: {why_not}")
    else:
        log(f"bytecode compiled in {time.monotonic() - start:.0f} s")


def _make_stage(parent: Path) -> tuple[Path, int]:
    """A private staging folder, locked before it gets the name sweepers look for."""
    tmp = Path(tempfile.mkdtemp(prefix=".greta-new-", dir=parent))
    fd = transaction.lock_stage(tmp)
    final = Path(tempfile.mkdtemp(prefix=transaction.STAGE_PREFIX, dir=parent))
    os.rename(tmp, final)  # replaces the empty placeholder; the lock moves with the inode
    return final, fd


def _commit(
    prepared: Prepared,
    staged: StageResult,
    stage: Path,
    scheme: Scheme,
    lock: transaction.EnvLock,
    log: Log,
    env: dict[str, str] | None,
    warnings: list[str],
) -> dict[str, Any]:
    plan = prepared.plan
    site = scheme.purelib
    txn = Transaction(site, scheme, stage)
    ctx = CommitContext(
        plan=plan,
        executable=prepared.executable or "",
        site_packages=site,
        scheme=scheme,
        staged=staged,
        stage_dir=stage,
        log=log,
        txn=txn,
        uv=prepared.uv,
        allow_http=prepared.request.allow_http,
        env=env,
        lock_fd=lock.fd,
    )
    step = "commit"
    try:
        txn.begin()
        txn.add_wheels(list(staged.files.values()))
        argv = commandline.install_argv(plan, str(stage), prepared.uv)
        log(f"installing {len(staged.files)} verified files offline with {plan.installer}")
        _checkpoint("installer")
        run_installer(argv, stage, log, env, lock.fd)
        for s in prepared.steps:
            step = s.name
            _checkpoint(step)
            try:
                s.run(ctx)
            except StepFailed as exc:
                if s.required:
                    raise
                warnings.append(f"{exc.step}: {exc.reason}")
                log(f"warning: {exc.step}: {exc.reason}")
        step = "finish"
        _checkpoint(step)
        txn.finish()
        return ctx.results
    except BaseException as exc:
        if txn.journal.state == "done":  # the install completed before this arrived
            if isinstance(exc, Interrupted):
                raise InstallFailed(
                    "interrupted after the install had completed: it is complete.",
                    128 + exc.signum,
                ) from None
            raise
        # Undoing now; a further Ctrl-C must not interrupt the undo or its message.
        transaction.ignore_signals()
        done = _undo(txn, site)
        raise InstallFailed(*_failure(exc, step, done)) from None


def _failure(exc: BaseException, step: str, done: str) -> tuple[str, int]:
    """The message and exit status for an install undone at `step` because of `exc`."""
    if isinstance(exc, Interrupted):
        return (
            f"interrupted during the install ({step}): the environment was put back as it "
            f"was{done}.",
            128 + exc.signum,
        )
    if isinstance(exc, KeyboardInterrupt):
        return (
            f"interrupted during the install ({step}): the environment was put back as it was{done}.",
            130,
        )
    if isinstance(exc, (InstallError, StepFailed)):
        reason = exc.reason
    else:
        reason = (
            f"{exc.__class__.__name__}: {exc}"
            if not isinstance(exc, (OSError, TransactionError))
            else str(exc)
        )
    where = (
        "failed during the offline install step"
        if step == "commit"
        else f"failed: {getattr(exc, 'step', step)}"
    )
    return f"{where}: {reason}. The environment was put back as it was{done}.", 1


def _undo(txn: Transaction, site: Path) -> str:
    try:
        done = txn.undo()
    except OSError as exc:
        raise InstallFailed(
            f"putting the environment back failed ({exc}); the journal in "
            f"{site / transaction.TXN_DIR} is kept and the next `greta install` finishes the undo"
        ) from None
    return f" ({'; '.join(done)})" if done else " (nothing had changed)"


# Test hooks are armed by a file, never by a variable alone. A lock's `# greta-env:` lines
# and greta-env.json can only set variables (and the allowlist refuses GRETA_TEST_* and any
# value that is a path), never create a file; so even a variable that slipped through
# cannot make an install wait. The harness writes the file in its own tmp dir: a regular
# file of this user, not writable by others, holding {"greta_test_hooks": 1, ...}, a key
# GRETA never writes anywhere else.
HOOKS_ENV = "GRETA_TEST_HOOKS"
HOOKS_KEY = "greta_test_hooks"
_HOOKS_MAX_BYTES = 4096


def armed_test_hooks() -> dict[str, object]:
    """The armed test hooks: {} unless GRETA_TEST_HOOKS names a hooks file as above."""
    import json
    import stat

    path = os.environ.get(HOOKS_ENV)
    if not path or not os.path.isabs(path):
        return {}
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except (OSError, ValueError):
        return {}
    try:
        info = os.fstat(fd)
        if (
            not stat.S_ISREG(info.st_mode)
            or info.st_uid != os.getuid()
            or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        ):
            return {}
        raw = os.read(fd, _HOOKS_MAX_BYTES + 1)
    except OSError:
        return {}
    finally:
        os.close(fd)
    try:
        hooks = json.loads(raw) if len(raw) <= _HOOKS_MAX_BYTES else None
    except (ValueError, RecursionError):
        return {}
    if (
        not isinstance(hooks, dict)
        or type(hooks.get(HOOKS_KEY)) is not int
        or hooks[HOOKS_KEY] != 1
    ):
        return {}
    return hooks


def _checkpoint(name: str) -> None:
    """Test hook: with an armed hooks file naming `checkpoint` <name>, announce the point
    and wait there (`wait` seconds), so the reliability tests can kill GRETA at an exact
    point of the commit, or go on once the file named by `release` exists."""
    hooks = armed_test_hooks()
    if not hooks or hooks.get("checkpoint") != name:
        return
    print(f"greta-checkpoint: {name}", file=sys.stderr, flush=True)
    import time

    wait = hooks.get("wait", 30)
    release = hooks.get("release")
    wait_s = float(wait) if isinstance(wait, int | float) and not isinstance(wait, bool) else 30.0
    deadline = time.monotonic() + min(max(wait_s, 0.0), 600.0)
    while time.monotonic() < deadline and not (
        isinstance(release, str) and os.path.exists(release)
    ):
        time.sleep(0.05)


def bad_python_reason(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip() or "it exited with no message"
