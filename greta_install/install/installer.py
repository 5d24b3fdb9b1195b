"""Stage an InstallPlan: download and verify every file before the environment is touched.

Every package of the plan is downloaded (one `pip download` each, so a failure names its
package) into a private staging directory and its sha256 checked against the lock. The
kernel wheel is fetched with a size cap and a deadline, checked against the hash the lock
pins, its RECORD, its manifest and a content rule (its own package only: no `.pth`, no
scripts, no files of other packages). Network errors, a missing version, a hash mismatch
or Ctrl-C all happen here, before anything is installed. The install itself (journalled,
undoable) is greta_install.install.pipeline's job.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from greta_install import boundedio, commandline
from greta_install.errors import GretaError
from greta_install.install.hashrecord import HashRecord, HashRecordError
from greta_install.locks import vendor_index
from greta_install.locks.lockgen import IndexLinks, sha256_file
from greta_install.locks.vendor_index import Probe
from greta_install.plan.install_plan import InstallPlan, KernelLookup, PlannedPackage

KERNEL_ENV = "GRETA_KERNEL_INDEX"
DOWNLOAD_TIMEOUT_ENV = "GRETA_DOWNLOAD_TIMEOUT"
DEFAULT_DOWNLOAD_TIMEOUT_S = 3600.0
KERNEL_WHEEL_MAX_BYTES = 512 * 1024 * 1024
KERNEL_DOWNLOAD_TIMEOUT_S = 600.0
INDEX_PAGE_TIMEOUT_S = 30.0
SOCKET_TIMEOUT_S = 30.0
MAX_PLATFORM_FLAGS = 64

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
    filenames: dict[str, str] = field(default_factory=dict)  # name -> staged file name
    commands: list[list[str]] = field(default_factory=list)  # what staging ran, in order


def download_timeout() -> float:
    try:
        return max(1.0, float(os.environ.get(DOWNLOAD_TIMEOUT_ENV, DEFAULT_DOWNLOAD_TIMEOUT_S)))
    except ValueError:
        return DEFAULT_DOWNLOAD_TIMEOUT_S


# --- tools ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Downloader:
    """How to run `pip download` for the target interpreter."""

    base: tuple[str, ...]  # e.g. (python, "-I", "-m", "pip")
    flags: tuple[str, ...] = ()  # tag flags when another interpreter's pip downloads

    def argv(self) -> list[str]:
        return [*self.base, "download", *self.flags]


def downloader_for(
    python: str,
    python_version: str,
    platform: str,
    target_has_pip: bool,
    uv: str | None = None,
    here_has_pip: bool | None = None,
) -> Downloader:
    """The target's own pip; else this interpreter's pip told the target's tags; else,
    in a `uv venv` without pip anywhere, pip run by uv (`uv tool run`, cached by uv)."""
    if target_has_pip:
        return Downloader(tuple(commandline.python_module(python, "pip")))
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
        # The lock parser bounds the version; this bounds the flag count regardless.
        for m in range(glibc, max(16, glibc - MAX_PLATFORM_FLAGS), -1):
            flags += ["--platform", f"manylinux_2_{m}_{arch}"]
        flags += ["--platform", f"manylinux2014_{arch}"]
    if here_has_pip is None:
        from greta_install.environment.tools import has_pip

        here_has_pip = has_pip(sys.executable)
    if not here_has_pip and uv is not None:
        return Downloader((uv, "tool", "run", "--from", "pip", "pip"), tuple(flags))
    return Downloader(tuple(commandline.python_module(sys.executable, "pip")), tuple(flags))


# --- bounded HTTP -----------------------------------------------------------------------


class DownloadError(GretaError, OSError):
    pass


class PlainHttpError(DownloadError):
    """A URL over plain http without --allow-http."""


class TooLargeError(DownloadError):
    """A response over its size limit (the download is cut there)."""


def check_url(url: str, allow_http: bool) -> None:
    scheme = urllib.parse.urlparse(url).scheme
    if scheme == "https" or (scheme == "http" and allow_http):
        return
    if scheme == "http":
        raise PlainHttpError(f"{url}: plain http is refused (use https, or pass --allow-http)")
    raise DownloadError(f"{url}: unsupported URL scheme {scheme!r}")


def fetch(
    url: str,
    sink: Callable[[bytes], None],
    *,
    max_bytes: int,
    deadline_s: float,
    allow_http: bool,
) -> int:
    """Stream `url` into `sink`: at most `max_bytes`, within `deadline_s` in all."""
    check_url(url, allow_http)
    deadline = time.monotonic() + deadline_s
    total = 0
    try:
        with urllib.request.urlopen(url, timeout=SOCKET_TIMEOUT_S) as response:
            final = response.geturl()
            if final != url:
                check_url(final, allow_http)  # a redirect must not downgrade to http
            length = response.headers.get("Content-Length")
            if length and length.isdigit() and int(length) > max_bytes:
                raise TooLargeError(f"{url}: {length} bytes, over the {max_bytes}-byte limit")
            while True:
                if time.monotonic() > deadline:
                    raise DownloadError(f"{url}: did not finish in {deadline_s:.0f} s")
                chunk = (
                    response.read1(1 << 16)
                    if hasattr(response, "read1")
                    else response.read(1 << 16)
                )
                if not chunk:
                    break
                total += len(chunk)
                if total > max_bytes:
                    raise TooLargeError(f"{url}: over the {max_bytes}-byte limit")
                sink(chunk)
    except DownloadError:
        raise
    except (OSError, urllib.error.URLError, ValueError) as exc:
        raise DownloadError(f"{url}: {exc}") from None
    return total


def fetch_text(url: str, allow_http: bool) -> str:
    parts: list[bytes] = []
    fetch(
        url,
        parts.append,
        max_bytes=boundedio.PAGE_MAX_BYTES,
        deadline_s=INDEX_PAGE_TIMEOUT_S,
        allow_http=allow_http,
    )
    return b"".join(parts).decode("utf-8", errors="replace")


# --- kernel wheel -----------------------------------------------------------------------


def find_kernel_wheel(
    source: str | None, requirement: str | None, allow_http: bool = False
) -> KernelLookup:
    """Look for the kernel wheel in a local directory or a simple index (no download).

    Both kinds of source follow one rule (`_choose`): where the source has a SHA256SUMS,
    only the wheels it lists are chosen; a wheel with a build tag is chosen only when
    SHA256SUMS lists it. A wheel left out is left out with the reason in `problem`."""
    if source is None or requirement is None:
        return KernelLookup(source)
    name, _, version = requirement.partition("==")
    if "://" in source and not source.startswith("file://"):
        return _find_on_index(source, requirement, name, version, allow_http)
    directory = Path(source[len("file://") :] if source.startswith("file://") else source)
    if not directory.is_dir():
        return KernelLookup(source, problem=f"kernel wheel directory {directory} does not exist")
    sums = _read_sha256sums(directory / "SHA256SUMS")
    found = [
        _Candidate(w.name, str(w), None)
        for w in sorted(directory.glob("*.whl"))
        if _is_wheel_of(w.name, name, version)
    ]
    return _choose(source, requirement, f"in {directory}", found, sums, [])


@dataclass(frozen=True)
class _Candidate:
    filename: str
    location: str  # a path or an https URL
    sha256: str | None  # from the index page's #sha256= fragment


def _find_on_index(
    source: str, requirement: str, name: str, version: str, allow_http: bool
) -> KernelLookup:
    page = f"{source.rstrip('/')}/{name}/"
    not_used = "so no kernel wheel is taken from it"
    try:
        html = fetch_text(page, allow_http)
    except PlainHttpError:
        return KernelLookup(
            source,
            problem=f"kernel index {source}: plain http is refused (use https, or pass "
            f"--allow-http), {not_used}",
        )
    except TooLargeError:
        return KernelLookup(
            source,
            problem=f"kernel index page {page} is over the {boundedio.PAGE_MAX_BYTES}-byte "
            f"limit for an index page: not read, {not_used}",
        )
    except DownloadError as exc:
        return KernelLookup(source, problem=f"kernel index {page} unreachable ({exc})")
    parser = IndexLinks()
    parser.feed(html)
    found: list[_Candidate] = []
    dropped: list[str] = []
    for href in parser.links:
        url = urllib.parse.urljoin(page, href)
        parsed = urllib.parse.urlparse(url)
        filename = urllib.parse.unquote(parsed.path.rsplit("/", 1)[-1])
        if not _is_wheel_of(filename, name, version):
            continue
        sha = parsed.fragment.split("=", 1)[1] if parsed.fragment.startswith("sha256=") else None
        scheme = parsed.scheme.lower()
        if scheme == "file":
            dropped.append(
                f"{filename} is linked as a local file ({url.split('#')[0][:200]}): an index "
                "may link only https files; dropped"
            )
        elif scheme == "http" and not allow_http:
            dropped.append(
                f"{filename} is linked over plain http: dropped (use https, or pass --allow-http)"
            )
        elif scheme not in ("https", "http"):
            dropped.append(f"{filename} is linked with the URL scheme {scheme!r}: dropped")
        else:
            found.append(_Candidate(filename, url.split("#")[0], sha))
    sums: dict[str, str] = {}
    sums_url = f"{source.rstrip('/')}/SHA256SUMS"
    parts: list[bytes] = []
    try:
        fetch(
            sums_url, parts.append, max_bytes=boundedio.SUMS_MAX_BYTES,
            deadline_s=INDEX_PAGE_TIMEOUT_S, allow_http=allow_http,
        )  # fmt: skip
        sums = _parse_sha256sums(b"".join(parts).decode("utf-8", errors="replace"))
    except DownloadError:
        pass  # no SHA256SUMS (or none readable): build-tagged wheels are then not chosen
    return _choose(source, requirement, f"on {source}", found, sums, dropped)


def _choose(
    source: str,
    requirement: str,
    where: str,
    found: list[_Candidate],
    sums: dict[str, str],
    dropped: list[str],
) -> KernelLookup:
    """The one choice among the wheels a source offers for `requirement` (see
    find_kernel_wheel); the first reason a wheel was dropped when none is left."""
    dropped = list(dropped)
    chosen: list[_Candidate] = []
    for cand in found:
        listed = sums.get(cand.filename)
        build = parse_wheel_filename(cand.filename)[2]
        if sums and listed is None:
            dropped.append(f"{cand.filename} {where} is not listed in its SHA256SUMS")
        elif build and listed is None:
            dropped.append(
                f"{cand.filename} {where} has a build tag ({build[0]}{build[1]}) and no "
                "SHA256SUMS lists it: not chosen"
            )
        elif listed and cand.sha256 and cand.sha256.lower() != listed:
            dropped.append(
                f"{cand.filename} {where}: its index page says sha256:{cand.sha256[:64]}, "
                f"SHA256SUMS says sha256:{listed}; dropped"
            )
        else:
            chosen.append(_Candidate(cand.filename, cand.location, cand.sha256 or listed))
    if chosen:
        return KernelLookup(source, chosen[0].location, chosen[0].sha256)
    if dropped:
        return KernelLookup(source, problem=dropped[0])
    return KernelLookup(source, problem=f"{requirement} is not {where}")


def _is_wheel_of(filename: str, name: str, version: str) -> bool:
    try:
        dist, wheel_version, _, _ = parse_wheel_filename(filename)
    except (InvalidWheelFilename, ValueError):
        return False
    return dist == canonicalize_name(name) and wheel_version == Version(version)


def _read_sha256sums(path: Path) -> dict[str, str]:
    try:
        return _parse_sha256sums(boundedio.read_text(path, boundedio.SUMS_MAX_BYTES))
    except (OSError, UnicodeDecodeError):
        return {}


def _parse_sha256sums(text: str) -> dict[str, str]:
    sums = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and len(parts[0]) == 64:
            sums[parts[1].lstrip("*")] = parts[0].lower()
    return sums


TRITON_NAMES = ("triton", "pytorch-triton-rocm", "pytorch-triton")


def kernel_package(requirement: str) -> str:
    """Import package of a kernel wheel: greta-kernels-sm-90==0.1.0 -> greta_kernels_sm_90."""
    name = requirement.partition("==")[0]
    return str(canonicalize_name(name)).replace("-", "_")


def locked_triton(plan: InstallPlan) -> str | None:
    """The Triton version the plan installs (a kernel wheel must be built with it)."""
    return next((p.version for p in plan.packages if p.name in TRITON_NAMES), None)


def verify_kernel_wheel(path: Path, plan: InstallPlan) -> dict[str, object]:
    """RECORD, content and manifest of a staged kernel wheel; InstallError naming the
    problem. Returns its manifest."""
    from greta_install.install.kernel_build import KernelWheelRefused, verify_wheel

    kw = plan.kernel_wheel
    assert kw.requirement is not None and kw.arch is not None
    name = kw.requirement.partition("==")[0]
    try:
        return verify_wheel(path, kw.arch, locked_triton(plan))
    except KernelWheelRefused as exc:
        raise InstallError(name, str(exc)) from None


# --- staging ----------------------------------------------------------------------------


def _reason(stderr: str) -> str:
    """The useful part of pip's complaint, classified."""
    text = stderr.strip()
    lowered = text.lower()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if "no space left on device" in lowered or "disk quota exceeded" in lowered:
        return (
            "the staging folder's disk is full (set TMPDIR to a folder with room): "
            + (lines[-1] if lines else "")[-300:]
        )
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
    pkg: PlannedPackage,
    downloader: Downloader,
    stage: Path,
    env: dict[str, str],
    use_index: bool = True,
) -> tuple[Path, list[str]]:
    argv = commandline.download_argv(downloader.argv(), pkg, str(stage), use_index)
    target_dir = Path(commandline.work_dir(str(stage), pkg.name))
    target_dir.mkdir(parents=True)
    Path(commandline.work_dir(str(stage), f"{pkg.name}.req")).write_text(
        commandline.requirement_line(pkg) + "\n", encoding="utf-8"
    )
    timeout = download_timeout()
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=commandline.download_env(env, vendor_only=bool(pkg.index and use_index)),
            stdin=subprocess.DEVNULL,
            cwd=stage,  # never the user's directory: nothing there is on the child's path
        )
    except subprocess.TimeoutExpired:
        raise InstallError(
            pkg.name, f"network error: download did not finish in {timeout:.0f} s"
        ) from None
    except OSError as exc:
        raise InstallError(pkg.name, f"could not run pip: {exc}") from None
    if proc.returncode != 0:
        raise InstallError(pkg.name, _reason(proc.stderr + "\n" + proc.stdout))
    files = [f for f in target_dir.iterdir() if f.is_file()]
    if len(files) != 1:
        raise InstallError(pkg.name, f"expected one downloaded file, found {len(files)}")
    return files[0], argv


def stage_plan(
    plan: InstallPlan,
    directory: Path,
    downloader: Downloader,
    log: Log = print,
    env: dict[str, str] | None = None,
    allow_http: bool = False,
    record: HashRecord | None = None,
    probe: Probe | None = None,
) -> StageResult:
    """Download and verify everything; raise InstallError naming the first failure.

    Files the lock has no hash for are checked against `record` (trust on first use):
    a file recorded earlier with another hash is refused. Vendor indexes are probed
    first (`probe`), so an unreachable one fails here, before any download, with its
    DNS or connection error, unless every file needed from it has a known hash.
    """
    if plan.blockers:
        raise InstallError(plan.blockers[0].split(":", 1)[0], plan.blockers[0])
    result = StageResult(directory)
    run_env = dict(os.environ if env is None else env)
    run_env.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    down = vendor_index.unreachable(
        [p.index for p in plan.packages if p.index], probe or vendor_index.probe
    )
    for pkg in plan.packages:
        if pkg.index in down and not (pkg.verified or pkg.recorded):
            raise InstallError(
                pkg.name,
                f"vendor index {pkg.index} is unreachable: {down[pkg.index]}. Nothing was "
                "downloaded. Check the network/DNS or a proxy, or install from a wheelhouse "
                "(--from-record FILE with a local bundle)",
            )
    for url, why in down.items():
        log(
            f"warning: vendor index {url}: {why}; its files are fetched from the configured "
            "index instead, and must match their known hashes"
        )
    total = len(plan.packages)
    for i, pkg in enumerate(plan.packages, start=1):
        use_index = pkg.index not in down
        source = pkg.index if pkg.index and use_index else "the configured index"
        log(f"[{i}/{total}] staging {pkg.requirement} from {source}")
        path, argv = _download_one(pkg, downloader, directory, run_env, use_index)
        result.commands.append(argv)
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
            if pkg.recorded and observed not in pkg.recorded:
                raise InstallError(
                    pkg.name,
                    f"{path.name} has {observed}, but an earlier install recorded "
                    f"{', '.join(pkg.recorded)} for {pkg.requirement}: refused (the file changed "
                    "since it was first trusted)",
                )
            if record is not None:
                try:
                    known = record.check(path.name, observed)
                except HashRecordError as exc:
                    raise InstallError(pkg.name, str(exc)) from None
            else:
                known = None
            result.observed_unverified[pkg.name] = observed
            result.filenames[pkg.name] = path.name
            if known is not None:
                log(f"    {path.name}: {observed} matches the recorded hash")
            else:
                log(
                    f"    FIRST USE {pkg.requirement}: {path.name} has {observed}; recorded "
                    "now, later installs must see the same (compare it with the vendor's)"
                )
        final = directory / path.name
        os.replace(path, final)
        result.files[pkg.name] = final
        result.hashes[pkg.name] = observed
    kw = plan.kernel_wheel
    if kw.status == "found" and kw.location and kw.requirement:
        name = kw.requirement.split("==")[0]
        log(f"staging kernel wheel {kw.requirement} from {kw.location}")
        result.commands.append(["copy", kw.location, str(directory)])
        final = _stage_kernel_wheel(kw.location, directory, name, allow_http)
        observed = "sha256:" + sha256_file(final)
        expected = kw.pinned or (f"sha256:{kw.sha256}" if kw.sha256 else None)
        source = "the lock pins" if kw.pinned else "SHA256SUMS says"
        if expected and observed != expected:
            raise InstallError(
                name, f"hash mismatch: {final.name} has {observed}, {source} {expected}"
            )
        if kw.sha256 and kw.pinned and observed != f"sha256:{kw.sha256}":
            raise InstallError(
                name,
                f"hash mismatch: {final.name} has {observed}, SHA256SUMS says sha256:{kw.sha256}",
            )
        if not kw.pinned:
            # Trusted on first use like any unpinned package: a different file of the same
            # name later is refused, not installed as UNVERIFIED again.
            known = None
            if record is not None:
                try:
                    known = record.check(final.name, observed)
                except HashRecordError as exc:
                    raise InstallError(name, str(exc)) from None
            if known is not None:
                log(f"    {final.name}: {observed} matches the recorded hash")
            else:
                log(
                    f"    FIRST USE kernel wheel {final.name}: {observed} (no hash pinned in "
                    "the lock); recorded now, later installs must see the same"
                )
            result.observed_unverified[name] = observed
            result.filenames[name] = final.name
        verify_kernel_wheel(final, plan)
        result.files[name] = final
        result.hashes[name] = observed
    shutil.rmtree(directory / ".work", ignore_errors=True)
    return result


def _intact_wheel(path: Path) -> bool:
    """Without a hash to compare, at least reject a truncated or corrupt archive."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as zf:
            return zf.testzip() is None
    except (zipfile.BadZipFile, OSError, EOFError):
        return False


def _stage_kernel_wheel(location: str, directory: Path, name: str, allow_http: bool) -> Path:
    if "://" in location and not location.startswith("file://"):
        filename = urllib.parse.unquote(urllib.parse.urlparse(location).path.rsplit("/", 1)[-1])
        if "/" in filename or filename in ("", ".", ".."):
            raise InstallError(name, f"refused: bad file name in {location}")
        final = directory / filename
        try:
            with open(final, "wb") as fh:
                fetch(
                    location,
                    fh.write,
                    max_bytes=KERNEL_WHEEL_MAX_BYTES,
                    deadline_s=KERNEL_DOWNLOAD_TIMEOUT_S,
                    allow_http=allow_http,
                )
        except DownloadError as exc:
            raise InstallError(name, f"network error: {exc}") from None
        return final
    source = Path(location[len("file://") :] if location.startswith("file://") else location)
    final = directory / source.name
    try:
        final.write_bytes(boundedio.read_bytes(source, KERNEL_WHEEL_MAX_BYTES))
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


def sha256_bytes(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()
