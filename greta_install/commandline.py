"""The command lines `greta install` runs, built in one place (pure), and the progress
line its kernel-build child prints back.

`--dry-run` shows exactly these argv lists (with `<stage>` for the staging directory);
the installer runs exactly these. Python children run isolated (`-I`): neither the
current directory nor PYTHON* variables can put a `pip/__main__.py` on their path.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from greta_install.errors import GretaError

if TYPE_CHECKING:
    from greta_install.plan.install_plan import InstallPlan, PlannedPackage

STAGE = "<stage>"  # placeholder for the temporary staging directory in shown commands
ISOLATED = "-I"  # ignore PYTHON* variables, the user site and the current directory


# The working directory of every Python child GRETA starts (unless its arguments are the
# user's relative paths): nothing there can be imported, read as configuration or written.
NEUTRAL_CWD = "/"
# `-I` drops PYTHONPATH too; a GRETA run from a checkout on PYTHONPATH must still reach
# its own code in the child, so its root goes first, and nothing else of the caller's.
_THIS_GRETA = (
    "import runpy, sys; root, name = sys.argv[1], sys.argv[2]; "
    "root in sys.path or sys.path.insert(0, root); sys.argv = [name, *sys.argv[3:]]; "
    "runpy.run_module(name, run_name='__main__', alter_sys=True)"
)


def python_module(python: str, module: str) -> list[str]:
    """`python -I -m module`: the module comes from the interpreter's own environment."""
    return [python, ISOLATED, "-m", module]


def greta_child(module: str, *args: str) -> list[str]:
    """argv that runs `module` of the GRETA this process runs (never one in the current
    directory or on PYTHONPATH) in this interpreter, isolated."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return [sys.executable, ISOLATED, "-c", _THIS_GRETA, root, module, *args]


def interpreter_path(value: str) -> str:
    """A `--python` argument as children run it: absolute when it names a path (they run
    from NEUTRAL_CWD), a bare name (found on PATH) as it is."""
    return os.path.abspath(value) if os.sep in value else value


LOCATION_MAX_CHARS = 4096


class LocationError(GretaError, ValueError):
    """A URL or path given by a variable or an option that no path or URL can be."""


def location(value: str, origin: str) -> str:
    """`value` (a URL or path from `origin`, e.g. GRETA_KERNEL_INDEX) as given, or
    LocationError in one line: control characters reach urllib/http.client as exceptions
    of their own (InvalidURL), or the OS as "embedded null byte", far from their origin."""
    if len(value) > LOCATION_MAX_CHARS:
        raise LocationError(
            f"{origin} is {len(value)} characters long, over the {LOCATION_MAX_CHARS}-character "
            "limit for a URL or path"
        )
    bad = next((i for i, ch in enumerate(value) if ord(ch) < 32 or ord(ch) == 127), None)
    if bad is not None:
        raise LocationError(
            f"{origin} holds a control character ({value[bad]!r} at position {bad}): "
            "set it to a URL or path"
        )
    return value


def env_location(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The URL or path a variable holds (None when unset or empty), checked by `location`."""
    value = (os.environ if environ is None else environ).get(name)
    return location(value, name) if value else None


def work_dir(stage: str, name: str) -> str:
    return f"{stage}/.work/{name}"


def download_argv(
    base: Sequence[str], pkg: PlannedPackage, stage: str, use_index: bool = True
) -> list[str]:
    """`pip download` of one package into its own folder, hash-checked by pip when the
    lock has hashes (they are in the requirements file beside that folder).

    `use_index=False` leaves out the vendor index (it did not answer the preflight): the
    file then comes from the configured default index or find-links, and its hash still
    has to match. A pure-Python selector the vendor ships only as source (`sdist`) is the
    one package allowed as a source archive."""
    binary = f"--no-binary={pkg.name}" if pkg.sdist else "--only-binary=:all:"
    argv = [
        *base,
        "--no-deps",
        binary,
        "--dest",
        work_dir(stage, pkg.name),
    ]
    if pkg.verified:
        argv.append("--require-hashes")
    if pkg.index and use_index:
        # The vendor's index is the ONLY index (never --extra-index-url): a same-named
        # package on the default index must not compete with the vendor's file.
        argv += ["--index-url", pkg.index]
    argv += ["-r", work_dir(stage, f"{pkg.name}.req")]
    return argv


# pip settings that would add another package source beside the vendor's index.
_OTHER_SOURCES = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX")


def download_env(env: Mapping[str, str], vendor_only: bool) -> dict[str, str]:
    """The environment of one `pip download`. For a vendor-index download, no other source
    may reach pip: the index/find-links variables are dropped and no pip configuration file
    is read (`PIP_CONFIG_FILE=os.devnull`, pip's documented switch), since a config file's
    extra-index-url would otherwise be consulted beside --index-url. Certificates and
    proxies still come from the environment (PIP_CERT, HTTPS_PROXY)."""
    out = dict(env)
    if vendor_only:
        for key in _OTHER_SOURCES:
            out.pop(key, None)
        out["PIP_CONFIG_FILE"] = os.devnull
    return out


def requirement_line(pkg: PlannedPackage) -> str:
    return pkg.requirement + "".join(f" --hash={h}" for h in pkg.hashes)


def install_argv(plan: InstallPlan, stage: str, uv: str | None = None) -> list[str]:
    """The offline install from the staged, verified files."""
    py = plan.python_executable or "python"
    common = [
        "--no-index",
        "--find-links",
        stage,
        "--no-deps",
        "--require-hashes",
        "-r",
        f"{stage}/requirements.txt",
    ]
    if plan.installer == "uv":
        # --no-cache: the stage is a fresh folder each run, so uv's cache could never serve
        # these files again; cached, each install left an unpacked copy of every wheel in
        # the user's uv cache (gigabytes for torch).
        return [uv or "uv", "pip", "install", "--python", py, "--offline", "--no-cache", *common]
    # --no-compile: the transaction knows every file the install writes; bytecode is
    # compiled at first import instead.
    return [*python_module(py, "pip"), "install", "--no-compile", *common]


def substitute(argv: Sequence[str], stage: str) -> list[str]:
    return [a.replace(STAGE, stage) for a in argv]


def shell(argv: Sequence[str]) -> str:
    return shlex.join(argv)


# The kernel build runs as a child (`greta build-kernels`, greta_core) and the installer
# relays its progress: the line's format is their contract, so it lives here, below both,
# and neither side imports the other for it.
def progress_line(done: int, total: int, detail: str, width: int = 24) -> str:
    """``[#####...] k/N detail``: the build's progress line, also what `parse_progress` reads."""
    filled = width * done // max(total, 1)
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {detail}"


_PROGRESS = re.compile(r"^\[[#.]+\] (\d+)/(\d+) ")


def parse_progress(line: str) -> tuple[int, int] | None:
    """(done, total) of a `progress_line`, None for any other line."""
    match = _PROGRESS.match(line)
    return (int(match.group(1)), int(match.group(2))) if match else None
