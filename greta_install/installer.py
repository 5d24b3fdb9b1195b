"""Carry out an InstallPlan, all or nothing.

1. Stage: download every package of the plan (one `pip download` each, so a failure
   names its package) into a temporary directory and check each file's sha256 against
   the lock. Network errors, a version missing from the index, a hash mismatch or
   Ctrl-C all happen here, before the environment is touched; the staging directory is
   removed whatever happens.
2. Commit: install offline from the staged, verified files (`--no-index --find-links
   STAGE --no-deps --require-hashes`), with uv when available, else pip. Nothing can be
   missing or altered any more; Ctrl-C is deferred until this short step finishes.
3. Persist the environment fixes (envfix).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from greta_install.errors import GretaError
from greta_install.lockgen import IndexLinks, sha256_file
from greta_install.plan import STAGE, InstallPlan, KernelLookup, PlannedPackage

DOWNLOAD_TIMEOUT_S = 3600
KERNEL_ENV = "GRETA_KERNEL_INDEX"

Log = Callable[[str], None]


class InstallError(GretaError):
    """A package could not be staged or installed; names the package and the reason."""

    def __init__(self, package: str, reason: str) -> None:
        super().__init__(f"{package}: {reason}")
        self.package = package
        self.reason = reason


@dataclass
class StageResult:
    directory: Path
    files: dict[str, Path] = field(default_factory=dict)
    hashes: dict[str, str] = field(default_factory=dict)  # name -> "sha256:<hex>" actually staged
    observed_unverified: dict[str, str] = field(default_factory=dict)


# --- tools ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Downloader:
    """How to run `pip download` for the target interpreter."""

    base: tuple[str, ...]  # e.g. (python, "-m", "pip")
    flags: tuple[str, ...] = ()  # tag flags when another interpreter's pip downloads

    def argv(self) -> list[str]:
        return [*self.base, "download", *self.flags]


def downloader_for(
    python: str, python_version: str, platform: str, target_has_pip: bool
) -> Downloader:
    """The target's own pip; else this interpreter's pip told the target's tags."""
    if target_has_pip:
        return Downloader((python, "-m", "pip"))
    major, minor = python_version.split(".")
    arch, _, libc = platform.partition("-")
    flags = [
        "--python-version",
        python_version,
        "--implementation",
        "cp",
        "--abi",
        f"cp{major}{minor}",
    ]
    if libc.startswith("manylinux_"):
        glibc = int(libc.split("_")[2])
        for m in range(glibc, 16, -1):
            flags += ["--platform", f"manylinux_2_{m}_{arch}"]
        flags += ["--platform", f"manylinux2014_{arch}"]
    return Downloader((sys.executable, "-m", "pip"), tuple(flags))


# --- kernel wheel -----------------------------------------------------------------------


def find_kernel_wheel(source: str | None, requirement: str | None) -> KernelLookup:
    """Look for the kernel wheel in a local directory or a simple index (no download)."""
    if source is None or requirement is None:
        return KernelLookup(source)
    name, _, version = requirement.partition("==")
    if source.startswith(("http://", "https://")):
        page = f"{source.rstrip('/')}/{name}/"
        try:
            with urllib.request.urlopen(page, timeout=15) as response:
                html = response.read().decode("utf-8", errors="replace")
        except (OSError, urllib.error.URLError, ValueError) as exc:
            return KernelLookup(source, problem=f"kernel index {page} unreachable ({exc})")
        parser = IndexLinks()
        parser.feed(html)
        for href in parser.links:
            url = urllib.parse.urljoin(page, href)
            parsed = urllib.parse.urlparse(url)
            filename = urllib.parse.unquote(parsed.path.rsplit("/", 1)[-1])
            if _is_wheel_of(filename, name, version):
                sha = (
                    parsed.fragment.split("=", 1)[1]
                    if parsed.fragment.startswith("sha256=")
                    else None
                )
                return KernelLookup(source, url.split("#")[0], sha)
        return KernelLookup(source, problem=f"{requirement} is not on {source}")
    directory = Path(source[len("file://") :] if source.startswith("file://") else source)
    if not directory.is_dir():
        return KernelLookup(source, problem=f"kernel wheel directory {directory} does not exist")
    sums = _read_sha256sums(directory / "SHA256SUMS")
    for wheel in sorted(directory.glob("*.whl")):
        if _is_wheel_of(wheel.name, name, version):
            return KernelLookup(source, str(wheel), sums.get(wheel.name))
    return KernelLookup(source, problem=f"{requirement} is not in {directory}")


def _is_wheel_of(filename: str, name: str, version: str) -> bool:
    try:
        dist, wheel_version, _, _ = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return False
    return dist == canonicalize_name(name) and wheel_version == Version(version)


def _read_sha256sums(path: Path) -> dict[str, str]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return {}
    sums = {}
    for line in lines:
        parts = line.split()
        if len(parts) == 2 and len(parts[0]) == 64:
            sums[parts[1].lstrip("*")] = parts[0].lower()
    return sums


# --- staging ----------------------------------------------------------------------------


def _reason(stderr: str) -> str:
    """The useful part of pip's complaint, classified."""
    text = stderr.strip()
    lowered = text.lower()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if "do not match the hashes" in lowered or "hash mismatch" in lowered:
        got = [line for line in lines if line.startswith(("Expected sha256", "Got"))]
        detail = "; ".join(got[:2]) or "the file differs from the lock"
        return f"hash mismatch (the download was altered or cut short): {detail}"
    if "no matching distribution" in lowered or "could not find a version" in lowered:
        kind = "version not found on the index"
    elif any(
        s in lowered
        for s in ("connection", "timed out", "incompleteread", "status code", "http error", " 50")
    ):
        kind = "network error"
    else:
        kind = "download failed"
    errors = [line for line in lines if line.startswith("ERROR")]
    detail = " / ".join(errors[-3:]) if errors else (lines[-1] if lines else "no output")
    return f"{kind}: {detail[-600:]}"


def _download_one(
    pkg: PlannedPackage, downloader: Downloader, workdir: Path, env: dict[str, str]
) -> Path:
    target_dir = workdir / pkg.name
    target_dir.mkdir()
    req = workdir / f"{pkg.name}.req"
    hashes = "".join(f" --hash={h}" for h in pkg.hashes)
    req.write_text(f"{pkg.requirement}{hashes}\n", encoding="utf-8")
    argv = [*downloader.argv(), "--no-deps", "--only-binary=:all:", "--dest", str(target_dir)]
    if pkg.verified:
        argv.append("--require-hashes")
    if pkg.index:
        argv += ["--extra-index-url", pkg.index]
    argv += ["-r", str(req)]
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=DOWNLOAD_TIMEOUT_S,
            check=False,
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise InstallError(
            pkg.name, f"network error: download did not finish in {DOWNLOAD_TIMEOUT_S} s"
        ) from None
    except OSError as exc:
        raise InstallError(pkg.name, f"could not run pip: {exc}") from None
    if proc.returncode != 0:
        raise InstallError(pkg.name, _reason(proc.stderr + "\n" + proc.stdout))
    files = [f for f in target_dir.iterdir() if f.is_file()]
    if len(files) != 1:
        raise InstallError(pkg.name, f"expected one downloaded file, found {len(files)}")
    return files[0]


def stage_plan(
    plan: InstallPlan,
    directory: Path,
    downloader: Downloader,
    log: Log = print,
    env: dict[str, str] | None = None,
) -> StageResult:
    """Download and verify everything; raise InstallError naming the first failure."""
    if plan.blockers:
        raise InstallError(plan.unverified[0], plan.blockers[0])
    result = StageResult(directory)
    work = directory / ".work"
    work.mkdir()
    run_env = dict(os.environ if env is None else env)
    run_env.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    total = len(plan.packages)
    for i, pkg in enumerate(plan.packages, start=1):
        log(f"[{i}/{total}] staging {pkg.requirement} from {pkg.index or 'the default index'}")
        path = _download_one(pkg, downloader, work, run_env)
        observed = "sha256:" + sha256_file(path)
        if pkg.verified and observed not in pkg.hashes:
            raise InstallError(
                pkg.name,
                f"hash mismatch: downloaded {path.name} has {observed}, the lock expects {', '.join(pkg.hashes)}",
            )
        if not pkg.verified:
            if path.suffix == ".whl" and not _intact_wheel(path):
                raise InstallError(
                    pkg.name,
                    f"network error: {path.name} is not a complete wheel (download cut short?)",
                )
            result.observed_unverified[pkg.name] = observed
            log(
                f"    UNVERIFIED {pkg.requirement}: {path.name} has {observed} (compare it with the vendor's)"
            )
        final = directory / path.name
        os.replace(path, final)
        result.files[pkg.name] = final
        result.hashes[pkg.name] = observed
    kw = plan.kernel_wheel
    if kw.status == "found" and kw.location and kw.requirement:
        name = kw.requirement.split("==")[0]
        log(f"staging kernel wheel {kw.requirement} from {kw.location}")
        final = _stage_kernel_wheel(kw.location, directory, name)
        observed = "sha256:" + sha256_file(final)
        if kw.sha256 and observed != f"sha256:{kw.sha256}":
            raise InstallError(
                name,
                f"hash mismatch: {final.name} has {observed}, SHA256SUMS says sha256:{kw.sha256}",
            )
        if not kw.sha256:
            log(f"    kernel wheel {final.name}: {observed} (no SHA256SUMS beside it)")
        result.files[name] = final
        result.hashes[name] = observed
    shutil.rmtree(work, ignore_errors=True)
    return result


def _intact_wheel(path: Path) -> bool:
    """Without a hash to compare, at least reject a truncated or corrupt archive."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as zf:
            return zf.testzip() is None
    except (zipfile.BadZipFile, OSError, EOFError):
        return False


def _stage_kernel_wheel(location: str, directory: Path, name: str) -> Path:
    if location.startswith(("http://", "https://")):
        filename = urllib.parse.unquote(urllib.parse.urlparse(location).path.rsplit("/", 1)[-1])
        final = directory / filename
        try:
            with urllib.request.urlopen(location, timeout=60) as response, open(final, "wb") as fh:
                shutil.copyfileobj(response, fh)
        except (OSError, urllib.error.URLError) as exc:
            raise InstallError(name, f"network error: {exc}") from None
        return final
    final = directory / Path(location).name
    try:
        shutil.copyfile(location, final)
    except OSError as exc:
        raise InstallError(name, f"cannot copy {location}: {exc}") from None
    return final


def write_stage_requirements(plan: InstallPlan, staged: StageResult) -> Path:
    """The requirements the offline install uses: exactly the staged files' hashes."""
    lines = [
        f"{name}=={_version_of(plan, name, staged)} --hash={h}" for name, h in staged.hashes.items()
    ]
    path = staged.directory / "requirements.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _version_of(plan: InstallPlan, name: str, staged: StageResult) -> str:
    for pkg in plan.packages:
        if pkg.name == name:
            return pkg.version
    _, version, _, _ = parse_wheel_filename(staged.files[name].name)
    return str(version)


# --- commit -----------------------------------------------------------------------------


def install_command(plan: InstallPlan, stage_dir: Path, uv: str | None) -> list[str]:
    argv = [
        str(stage_dir) if a == STAGE else a.replace(STAGE, str(stage_dir))
        for a in plan.commands["install"]
    ]
    if plan.installer == "uv":
        if uv is None:
            raise InstallError("uv", "the plan asks for uv but uv was not found")
        argv[0] = uv
        argv.insert(argv.index("--no-index"), "--offline")
    return argv


def commit(argv: list[str], log: Log = print) -> None:
    """Run the offline install; Ctrl-C waits until it is done rather than half-install."""
    interrupted: list[int] = []

    def defer(signum: int, frame: FrameType | None) -> None:
        interrupted.append(signum)
        log(
            "greta: interrupt received; finishing the offline install so the environment stays consistent"
        )

    previous = signal.signal(signal.SIGINT, defer) if _main_thread() else None
    try:
        # Own session: a terminal Ctrl-C does not reach the installer child either.
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            check=False,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
        )
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    if proc.returncode != 0:
        raise InstallError(
            "install",
            f"the offline install from verified files failed ({argv[0]} exit {proc.returncode}): "
            f"{(proc.stderr or proc.stdout).strip()[-1500:]}",
        )
    if interrupted:
        raise KeyboardInterrupt


def commit_or_restore(
    argv: list[str], site_packages: Path | None, names: list[str], log: Log = print
) -> None:
    """`commit`, and if the installer fails midway, put the replaced packages back."""
    from greta_install import rollback

    saved = None
    if site_packages is not None:
        try:
            saved = rollback.backup(site_packages, names)
        except OSError as exc:  # no backup is no reason to refuse; say so
            log(f"warning: cannot save the packages this install replaces ({exc}): no rollback")
    try:
        commit(argv, log)
    except InstallError as exc:
        if saved is None:
            raise
        try:
            done = rollback.restore(saved)
        except OSError as undo:
            raise InstallError(
                "install", f"{exc.reason}. Restoring the previous packages failed too: {undo}"
            ) from None
        raise InstallError(
            "install",
            f"{exc.reason}. The environment was put back as it was ({'; '.join(done) or 'nothing had changed'})",
        ) from None
    finally:
        rollback.discard(saved)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def execute(
    plan: InstallPlan,
    downloader: Downloader,
    uv: str | None,
    site_packages: Path | None,
    log: Log = print,
    env: dict[str, str] | None = None,
    stage_root: str | None = None,
) -> StageResult:
    """Stage, verify, install and persist the environment fixes. Cleans up always."""
    from greta_install import envfix

    directory = Path(tempfile.mkdtemp(prefix="greta-stage-", dir=stage_root))
    try:
        staged = stage_plan(plan, directory, downloader, log, env)
        write_stage_requirements(plan, staged)
        argv = install_command(plan, directory, uv)
        log(f"installing {len(staged.files)} verified files offline with {plan.installer}")
        commit_or_restore(argv, site_packages, list(staged.files), log)
        if site_packages is not None:
            if plan.env:
                envfix.write_env_fixes(
                    site_packages, plan.env, plan.env_why, plan.target, plan.arch
                )
                log(f"environment fixes persisted in {site_packages / envfix.JSON_NAME}")
            else:
                envfix.clear_env_fixes(site_packages)
        return staged
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def warm_kernel_wheel(executable: str, log: Log = print, timeout: float = 900) -> bool:
    """Run `greta warm` in the target environment: build the kernel wheel's host launchers.

    Optional by nature: when it cannot run (greta not installed in that environment, no C
    compiler, no GPU runtime) the kernels still work and build their launchers at first
    use, so this warns instead of failing the install.
    """
    argv = [executable, "-m", "greta", "warm"]
    log("building the kernel wheel's host launchers (greta warm)")
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log(
            f"warning: greta warm did not finish ({exc}); the first kernel call builds them instead"
        )
        return False
    for line in (proc.stdout + proc.stderr).strip().splitlines():
        log(f"    {line}")
    if proc.returncode != 0:
        log(
            "warning: greta warm failed: the first call of each kernel builds its launcher "
            f"instead. Retry with: {executable} -m greta warm"
        )
        return False
    return True


def sha256_bytes(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()
