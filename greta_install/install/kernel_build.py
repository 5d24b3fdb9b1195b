"""A GRETA kernel wheel on every machine: reuse, or build here, then cache.

When no index or directory serves the kernel wheel for the GPU's arch, the installer
builds it after torch and triton are installed, in the target environment (so the
exact installed Triton compiles it), and keeps the wheel in the user's cache, keyed
by arch + Triton fingerprint + GRETA source hash: a reinstall, or a second
environment with the same Triton, reuses it at once. `write_index` turns a folder of
wheels into a static PEP 503 index (+ SHA256SUMS) that any web server can serve and
`GRETA_KERNEL_INDEX` can point at.

The build itself is `greta build-kernels` run by the target environment's Python;
this module only starts it (it compiles on all cores), relays its progress, checks the
result and files it. The CPU row has no kernel wheel: Triton runs in its interpreter
there, nothing is precompiled.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import html
import importlib.util
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.utils import parse_wheel_filename

from greta_install.commandline import (
    ISOLATED,
    NEUTRAL_CWD,
    LocationError,
    env_location,
    parse_progress,
    python_module,
)
from greta_install.errors import GretaError
from greta_install.kernel_names import distribution_name as kernel_wheel_name
from greta_install.version import __version__

Log = Callable[[str], None]
BUILD_TIMEOUT_S = 3 * 3600
PROGRESS_EVERY_S = 5.0


class KernelBuildError(GretaError):
    """The kernel wheel could not be built or filed; the message says why."""


class KernelWheelRefused(GretaError, ValueError):
    """A kernel wheel that breaks a content rule; the message names the wheel and the rule."""


# Everything a kernel wheel unpacks to (its precompiled kernels and tables are a few tens of
# MB): a 1.5 MB download of 1.5 GiB of zeros is refused before anything is read.
MAX_UNCOMPRESSED_BYTES = 512 * 1024 * 1024


def verify_wheel(
    path: Path, arch: str, locked_triton: str | None = None, fingerprint: str | None = None
) -> dict[str, Any]:
    """The one check of a kernel wheel before it is installed, whatever brought it (an index,
    a folder, the build cache, a fresh build): unpacked size under the cap, RECORD hashes,
    nothing outside its own package (no .pth, scripts or data), a manifest for `arch` naming
    the Triton it was built with (matching `locked_triton` when the lock pins one, and
    `fingerprint`, the installed Triton's build, when the caller knows it).
    Returns the manifest; KernelWheelRefused otherwise. `verify_installed` holds an
    installed kernel wheel to the same rules."""
    from greta_install.environment import wheelfiles

    package = kernel_wheel_name(arch).replace("-", "_")
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
        _check_size(path.name, sum(i.file_size for i in infos))
        wheelfiles.check_confined(path, [package])
        wheelfiles.check_record(path)
        raw = wheelfiles.read_member_text(path, f"{package}/manifest.json")
    except (wheelfiles.WheelError, zipfile.BadZipFile, OSError) as exc:
        raise KernelWheelRefused(f"refused: {exc}") from None
    if raw is None:
        raise KernelWheelRefused(f"refused: {path.name} has no {package}/manifest.json")
    return _check_manifest(raw, arch, locked_triton, fingerprint)


def _check_size(name: str, unpacked: int) -> None:
    if unpacked > MAX_UNCOMPRESSED_BYTES:
        raise KernelWheelRefused(
            f"{name}: unpacks to {unpacked} bytes, over the "
            f"{MAX_UNCOMPRESSED_BYTES}-byte limit; refused"
        )


def _check_manifest(
    raw: str, arch: str, locked_triton: str | None, fingerprint: str | None
) -> dict[str, Any]:
    from packaging.version import InvalidVersion, Version

    try:
        manifest = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise KernelWheelRefused(f"refused: its manifest.json is not JSON ({exc})") from None
    if not isinstance(manifest, dict):
        raise KernelWheelRefused("refused: its manifest.json is not a JSON object")
    if manifest.get("arch") != arch:
        raise KernelWheelRefused(
            f"refused: its manifest says arch {str(manifest.get('arch'))[:40]!r}, "
            f"the target is {arch}"
        )
    built_with = manifest.get("triton_version")
    if not isinstance(built_with, str) or not built_with:
        raise KernelWheelRefused("refused: its manifest names no triton_version")

    def release(version: str) -> tuple[int, ...] | None:
        try:
            return Version(version).release
        except InvalidVersion:
            return None

    if release(built_with) is None:
        raise KernelWheelRefused(f"refused: its manifest's triton_version {built_with[:40]!r}")
    if locked_triton and release(built_with) != release(locked_triton):
        raise KernelWheelRefused(
            f"refused: built with Triton {built_with}, the lock installs Triton {locked_triton}"
        )
    if fingerprint is not None and manifest.get("triton_fingerprint") != fingerprint:
        raise KernelWheelRefused(
            f"refused: built for the Triton build "
            f"{str(manifest.get('triton_fingerprint'))[:40]!r}, the installed one is {fingerprint}"
        )
    return manifest


# --- an installed kernel wheel (`greta warm` and anything that loads one) -----------------

INSTALLED_KEY = "installed:{dist_info}"  # its entry in the environment's hash record


@dataclass(frozen=True)
class InstalledWheel:
    dist_info: Path
    manifest: dict[str, Any]
    digest: str  # "sha256:<hex>" over its package files' RECORD paths and hashes


def verify_installed(site: Path, arch: str, locked_triton: str | None = None) -> InstalledWheel:
    """`verify_wheel`'s rules for the kernel wheel of `arch` installed in `site` (pip may
    have put it there by hand, past every check): one dist-info whose RECORD names only
    its package and itself (no .pth, scripts or data), every package file listed with a
    matching sha256 and nothing else in the package (bytecode caches aside), the size cap,
    the manifest. KernelWheelRefused otherwise."""
    from greta_install.environment import wheelfiles

    package = kernel_wheel_name(arch).replace("-", "_")
    infos = wheelfiles.installed_dist_infos(site, [kernel_wheel_name(arch)])
    if len(infos) != 1:
        raise KernelWheelRefused(
            f"refused: {len(infos)} installed distributions of {kernel_wheel_name(arch)} "
            f"in {site} (want 1)"
        )
    info = infos[0]
    try:
        rows = wheelfiles.installed_record(info)
        listed: dict[str, str] = {}
        for member, digest in rows.items():
            wheelfiles.check_member(info.name, member, info.name, [package], installed=True)
            if member.split("/")[0] == package:
                listed[member] = digest
        total = 0
        root = site / package
        present = set()
        # os.walk never descends a linked folder (a link loop cannot hang it); links are
        # refused, and the walk stops at the member cap.
        for folder, dirs, files in os.walk(root, followlinks=False):
            for name in [*dirs, *files]:
                path = Path(folder) / name
                if path.is_symlink():
                    raise wheelfiles.WheelError(f"{path.relative_to(site)} is a symbolic link")
                if name in dirs:
                    continue
                member = path.relative_to(site).as_posix()
                if member not in listed and path.parent.name == "__pycache__":
                    continue  # written by Python when it imports the package
                present.add(member)
                if len(present) > wheelfiles.MAX_MEMBERS or member not in listed:
                    raise wheelfiles.WheelError(f"{member} is not in {info.name}/RECORD")
                total += path.stat().st_size
        _check_size(info.name, total)
        for member, digest in listed.items():
            if member not in present:
                raise wheelfiles.WheelError(f"{info.name}/RECORD names {member}, which is missing")
            if not digest and member.endswith(".pyc"):
                continue  # installers list the bytecode they compile without a hash
            if digest != _record_digest_of(site / member):
                raise wheelfiles.WheelError(f"{member} does not match its RECORD hash")
        raw = _read_small(root / "manifest.json")
    except (wheelfiles.WheelError, OSError, UnicodeDecodeError) as exc:
        raise KernelWheelRefused(f"refused: {exc}") from None
    manifest = _check_manifest(raw, arch, locked_triton, None)
    return InstalledWheel(info, manifest, _content_digest(listed))


def _record_digest_of(path: Path) -> str:
    """wheelfiles.record_digest of a file, read in blocks."""
    import base64

    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return "sha256=" + base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()


def _content_digest(listed: dict[str, str]) -> str:
    """What an installed kernel wheel holds, from its RECORD rows (bytecode aside)."""
    blob = "".join(f"{m},{d}\n" for m, d in sorted(listed.items()) if not m.endswith(".pyc"))
    return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()


def recorded_state(site: Path, arch: str) -> str:
    """How the installed kernel wheel of `arch` stands against the environment's hash record,
    read cheaply (its RECORD, not its files) where it is loaded at run time: "matches" (the
    content GRETA verified), "differs" (changed since: not to be loaded), or "unrecorded"."""
    from greta_install.environment import wheelfiles
    from greta_install.install import hashrecord

    package = kernel_wheel_name(arch).replace("-", "_")
    infos = wheelfiles.installed_dist_infos(site, [kernel_wheel_name(arch)])
    if len(infos) != 1:
        return "differs"
    try:
        record = hashrecord.load_record(hashrecord.env_record_path(site))
        entry = record.expected(INSTALLED_KEY.format(dist_info=infos[0].name))
        if entry is None:
            return "unrecorded"
        rows = wheelfiles.installed_record(infos[0])
    except (hashrecord.HashRecordError, wheelfiles.WheelError, OSError):
        return "differs"
    listed = {m: d for m, d in rows.items() if m.split("/")[0] == package}
    return "matches" if entry.sha256 == _content_digest(listed) else "differs"


def _read_small(path: Path) -> str:
    from greta_install import boundedio
    from greta_install.environment import wheelfiles

    return boundedio.read_text(path, wheelfiles.MAX_METADATA_BYTES)


def trust_installed(site: Path, arch: str, *, vouch: bool, log: Log = print) -> InstalledWheel:
    """`verify_installed`, then trust on first use in the environment's hash record, like
    packages: `vouch` (GRETA installed this wheel just now, after `verify_wheel`) records
    its content; otherwise content other than the recorded one is refused, and a wheel
    seen for the first time is recorded. KernelWheelRefused when refused."""
    from greta_install.install import hashrecord

    wheel = verify_installed(site, arch)
    key = INSTALLED_KEY.format(dist_info=wheel.dist_info.name)
    path = hashrecord.env_record_path(site)
    version = wheel.dist_info.name[: -len(".dist-info")].rpartition("-")[2]
    entry = hashrecord.Entry(
        kernel_wheel_name(arch), version, wheel.digest,
        "installed kernel wheel", "greta install" if vouch else "greta warm (first use)",
    )  # fmt: skip
    try:
        record = hashrecord.load_record(path)
        if vouch:
            record.entries[key] = entry
        elif record.check(key, wheel.digest) is not None:
            return wheel
        else:
            record.add(key, entry)
            log(f"FIRST USE installed kernel wheel {wheel.dist_info.name}: {wheel.digest} recorded")
        hashrecord.save_record(record, path)
    except hashrecord.HashRecordError as exc:
        raise KernelWheelRefused(f"refused: {exc}") from None
    except OSError as exc:  # a read-only environment: checked, not recorded
        log(f"warning: cannot record the kernel wheel's hash in {path}: {exc}")
    return wheel


@dataclass(frozen=True)
class BuiltWheel:
    path: Path
    arch: str
    sha256: str  # hex
    cached: bool  # True: reused from the cache, nothing was compiled
    seconds: float


# Everything in greta_core that decides what a kernel wheel compiles, beside the tables:
# the kernels, the block choices of each table entry, the AOT compiler (variants, stand-in
# values, specialisation) and the ops (a declared op's AOT specs come from its plans' cases).
SOURCE_FILES: tuple[str, ...] = (
    "kernels/*.py", "configs/blocks.py", "kernel_wheels/aot.py", "ops/*.py",
)  # fmt: skip


def greta_source_hash(table_text: str | None = None) -> str:
    """sha256 of what a kernel wheel is built from: ``SOURCE_FILES``, the config table(s)
    and GRETA's version. The one source hash: the wheel cache key (every shipped table)
    and a wheel's manifest (`table_text`, the table it ships) both come from here.

    Read from the files, never by importing greta_core (the installer runs before torch).
    """
    spec = importlib.util.find_spec("greta_core")
    if spec is None or not spec.submodule_search_locations:
        raise KernelBuildError("greta_core is not importable here: cannot build kernel wheels")
    root = Path(next(iter(spec.submodule_search_locations)))
    files = sorted({path for pattern in SOURCE_FILES for path in root.glob(pattern)})
    if table_text is None:
        files += sorted(root.joinpath("configs", "tables").glob("*.json"))
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    if table_text is not None:
        digest.update(b"table\0" + table_text.encode() + b"\0")
    digest.update(__version__.encode())
    return digest.hexdigest()


def triton_fingerprint(python: str, timeout: float = 300) -> str:
    """The installed Triton's build fingerprint, read in the target environment."""
    code = "from greta_core.kernel_wheels.aot import triton_fingerprint as f; print(f())"
    try:
        proc = subprocess.run(
            [python, ISOLATED, "-c", code],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            env=_child_env(),
            cwd=NEUTRAL_CWD,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KernelBuildError(f"cannot read the installed Triton's fingerprint: {exc}") from None
    out = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not out:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise KernelBuildError(f"cannot read the installed Triton's fingerprint: {tail}")
    return out[-1].strip()


def cache_key(arch: str, fingerprint: str, source_hash: str) -> str:
    blob = f"{arch}\0{fingerprint}\0{source_hash}".encode()
    return f"{arch}-{hashlib.sha256(blob).hexdigest()[:24]}"


def cache_root() -> Path:
    try:
        override = env_location("GRETA_KERNEL_CACHE")
    except LocationError as exc:
        raise KernelBuildError(str(exc)) from None
    if override:
        return Path(override)
    import platformdirs

    return Path(platformdirs.user_cache_dir("greta", appauthor=False)) / "kernel-wheels"


def cached_wheel(directory: Path, arch: str) -> Path | None:
    """The intact wheel of `arch` in a cache entry, or None (a torn entry is ignored)."""
    if not directory.is_dir():
        return None
    for wheel in sorted(directory.glob("*.whl")):
        try:
            name, _, _, _ = parse_wheel_filename(wheel.name)
        except ValueError:
            continue
        if name == kernel_wheel_name(arch) and _intact(wheel):
            return wheel
    return None


def _intact(wheel: Path) -> bool:
    try:
        with zipfile.ZipFile(wheel) as zf:
            return zf.testzip() is None
    except (zipfile.BadZipFile, OSError):
        return False


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    # "0", not unset: a cpu-row environment's greta-env.pth re-sets unset variables.
    env["TRITON_INTERPRET"] = "0"
    return env


def build_or_reuse(
    python: str,
    arch: str,
    *,
    jobs: int = 0,
    use_cache: bool = True,
    log: Log = print,
    timeout: float = BUILD_TIMEOUT_S,
    locked_triton: str | None = None,
) -> BuiltWheel:
    """The kernel wheel of `arch` for the Triton installed in `python`'s environment.

    Whatever it returns passed `verify_wheel` for that Triton's build (and `locked_triton`)
    and its trust-on-first-use hash: a cached wheel that fails either is rebuilt, never
    returned; a fresh build that fails is KernelBuildError."""
    start = time.perf_counter()
    fingerprint = triton_fingerprint(python)
    entry = cache_root() / cache_key(arch, fingerprint, greta_source_hash())
    if use_cache:
        found = cached_wheel(entry, arch)
        if found is not None:
            try:
                verify_wheel(found, arch, locked_triton, fingerprint)
                _trust_cached(entry, found, built=False, log=log)
            except KernelWheelRefused as exc:  # tampered or torn: rebuilt, never installed
                log(f"kernel wheel for {arch}: the cached build {found} is {exc}; rebuilding it")
                shutil.rmtree(entry, ignore_errors=True)
            else:
                log(f"kernel wheel for {arch}: reusing the cached build {found}")
                return BuiltWheel(found, arch, _sha256(found), True, time.perf_counter() - start)
    with tempfile.TemporaryDirectory(prefix="greta-kbuild-") as work:
        out = Path(work) / "out"
        scratch = Path(work) / "tmp"
        scratch.mkdir()
        log(
            f"building the kernel wheel for {arch} with the installed Triton "
            "(one-time; the result is cached)"
        )
        env = _child_env()
        # The build's staging dirs land in our work dir: a killed build leaves nothing behind.
        env["TMPDIR"] = str(scratch)
        _run_with_progress(build_argv(python, arch, str(out), jobs), env, arch, log, timeout)
        wheel = cached_wheel(out, arch)
        if wheel is None:
            raise KernelBuildError(f"greta build-kernels wrote no intact wheel for {arch}")
        try:
            verify_wheel(wheel, arch, locked_triton, fingerprint)
        except KernelWheelRefused as exc:
            raise KernelBuildError(f"the kernel wheel built for {arch} is {exc}") from None
        entry.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
        shutil.copy2(wheel, staging / wheel.name)
        shutil.rmtree(entry, ignore_errors=True)
        os.replace(staging, entry)  # the cache entry appears whole or not at all
    final = entry / wheel.name
    _trust_cached(entry, final, built=True, log=log)
    seconds = time.perf_counter() - start
    log(f"kernel wheel for {arch} built in {seconds:.0f}s, cached in {entry}")
    return BuiltWheel(final, arch, _sha256(final), False, seconds)


def _trust_cached(entry: Path, wheel: Path, *, built: bool, log: Log) -> None:
    """Trust on first use for the build cache, in the user's hash record: a wheel built here
    is recorded under its cache entry (its inputs: arch, Triton build, GRETA source); a
    cached one must still have that hash (KernelWheelRefused: rebuilt)."""
    from greta_install.install import hashrecord

    key = f"kernel-cache:{entry.name}:{wheel.name}"
    sha = "sha256:" + _sha256(wheel)
    name, version, _, _ = parse_wheel_filename(wheel.name)
    made = hashrecord.Entry(str(name), str(version), sha, "built here", f"greta cache {entry.name}")
    path = hashrecord.user_record_path()
    try:
        record = hashrecord.load_record(path)
        if built:
            record.entries[key] = made  # built just now: the cache entry's new content
        elif record.check(key, sha) is not None:
            return
        else:
            record.add(key, made)
        hashrecord.save_record(record, path)
    except hashrecord.HashRecordError as exc:
        raise KernelWheelRefused(f"refused: {exc}") from None
    except OSError as exc:
        log(f"warning: cannot record the kernel wheel's hash in {path}: {exc}")


def build_argv(python: str, arch: str, out: str, jobs: int = 0) -> list[str]:
    """The build command (shown by --dry-run, run by build_or_reuse).

    No ``--jobs`` when `jobs` is 0: the build then uses ``GRETA_BUILD_JOBS`` or all cores.
    """
    argv = [*python_module(python, "greta"), "build-kernels", "--arch", arch, "--out", out]
    return argv + (["--jobs", str(jobs)] if jobs > 0 else [])


def _run_with_progress(
    argv: list[str], env: dict[str, str], arch: str, log: Log, timeout: float
) -> None:
    """Run the build, relaying its lines: every other line at once, progress lines (one per
    kernel) the first, each failed one, the last, and one per PROGRESS_EVERY_S between."""
    start = time.perf_counter()
    try:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd=NEUTRAL_CWD,
            start_new_session=True,  # one process group: the build and all its workers
        )
    except OSError as exc:
        raise KernelBuildError(f"cannot run greta build-kernels: {exc}") from None
    lines: queue.Queue[str | None] = queue.Queue()
    # A reader thread: the pipe is drained while we wait (hundreds of lines would fill it).
    threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
    tail: collections.deque[str] = collections.deque(maxlen=12)
    last = -PROGRESS_EVERY_S
    try:
        while True:
            try:
                line = lines.get(timeout=0.5)
            except queue.Empty:
                line = ""
            now = time.perf_counter() - start
            if now > timeout:
                _kill_group(proc)
                raise KernelBuildError(f"the kernel build for {arch} ran past {timeout:.0f}s")
            if line is None:
                break
            if not line.strip():
                continue
            tail.append(line)
            counts = parse_progress(line)
            if counts is None:
                log(f"  {line}")
            elif " ERROR " in line or counts[0] == counts[1] or now - last >= PROGRESS_EVERY_S:
                last = now
                log(f"  {line}")
        proc.wait()
    except BaseException:
        _kill_group(proc)
        raise
    if proc.returncode != 0:
        raise KernelBuildError(
            f"greta build-kernels failed for {arch} (exit {proc.returncode}):\n" + "\n".join(tail)
        )


def _pump(stream: Any, lines: queue.Queue[str | None]) -> None:
    try:
        for line in stream:
            lines.put(line.rstrip("\n"))
    finally:
        lines.put(None)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """Stop the build and its worker processes (they share its process group)."""
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def install_wheel(
    python: str, wheel: Path, log: Log = print, uv: str | None = None, arch: str | None = None
) -> None:
    """Install one kernel wheel into `python`'s environment, offline, hash-checked; with
    `arch`, then vouch for what was installed (`trust_installed`) so `greta warm` holds it
    to that content."""
    wheel = wheel.absolute()  # pip runs from NEUTRAL_CWD
    sha = _sha256(wheel)
    name, version, _, _ = parse_wheel_filename(wheel.name)
    with tempfile.TemporaryDirectory(prefix="greta-kinst-") as work:
        req = Path(work) / "requirements.txt"
        req.write_text(f"{name}=={version} --hash=sha256:{sha}\n", encoding="utf-8")
        common = ["--no-index", "--find-links", str(wheel.parent), "--no-deps", "--require-hashes"]
        if uv:
            # --no-cache: a freshly built wheel; see commandline.install_argv.
            argv = [uv, "pip", "install", "--python", python, "--offline", "--no-cache", *common,
                    "-r", str(req)]  # fmt: skip
        else:
            argv = [*python_module(python, "pip"), "install", "--disable-pip-version-check"]
            argv += common
            argv += ["--force-reinstall", "-r", str(req)]
        proc = subprocess.run(
            argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, cwd=NEUTRAL_CWD
        )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip()[-800:]
        raise KernelBuildError(f"installing {wheel.name} failed: {tail}")
    log(f"installed {wheel.name} (sha256:{sha})")
    if arch is not None:
        from greta_install.environment.tools import site_packages_of

        try:
            trust_installed(site_packages_of(python), arch, vouch=True, log=log)
        except (KernelWheelRefused, GretaError, OSError) as exc:
            raise KernelBuildError(f"installed {wheel.name}, but it is {exc}") from None


def write_index(wheels: list[Path], out: Path) -> Path:
    """A static PEP 503 index in `out`: the wheels, one page per project, SHA256SUMS.

    `out` then works both as a directory (--kernel-wheels DIR) and, served by any web
    server, as an index URL (GRETA_KERNEL_INDEX=https://host/path).
    """
    out.mkdir(parents=True, exist_ok=True)
    sums: dict[str, str] = {}
    projects: dict[str, list[str]] = {}
    for wheel in wheels:
        name, _, _, _ = parse_wheel_filename(wheel.name)
        target = out / wheel.name
        if wheel.resolve() != target.resolve():
            shutil.copy2(wheel, target)
        sums[wheel.name] = _sha256(target)
        projects.setdefault(str(name), []).append(wheel.name)
    # Merge with what the folder already holds, so an index grows arch by arch.
    for line in _read_lines(out / "SHA256SUMS"):
        parts = line.split()
        if len(parts) == 2 and (out / parts[1]).is_file():
            sums.setdefault(parts[1], parts[0])
            name, _, _, _ = parse_wheel_filename(parts[1])
            projects.setdefault(str(name), [])
            if parts[1] not in projects[str(name)]:
                projects[str(name)].append(parts[1])
    (out / "SHA256SUMS").write_text(
        "".join(f"{sha}  {fn}\n" for fn, sha in sorted(sums.items())), encoding="utf-8"
    )
    root_links = []
    for project, files in sorted(projects.items()):
        page = out / project
        page.mkdir(exist_ok=True)
        links = "".join(
            f'<a href="../{html.escape(fn)}#sha256={sums[fn]}">{html.escape(fn)}</a><br>\n'
            for fn in sorted(files)
        )
        (page / "index.html").write_text(
            f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n", encoding="utf-8"
        )
        root_links.append(f'<a href="{project}/">{project}</a><br>\n')
    (out / "index.html").write_text(
        "<!DOCTYPE html>\n<html><body>\n" + "".join(root_links) + "</body></html>\n",
        encoding="utf-8",
    )
    return out


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []


if __name__ == "__main__":  # pragma: no cover - manual use
    built = build_or_reuse(sys.executable, sys.argv[1])
    print(built)
