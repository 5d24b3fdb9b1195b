"""Environment fixes that persist inside the target environment.

`greta install` writes three files into the environment's site-packages:

- `greta-env.json`: the fixes (and why each is needed);
- `_greta_env.py`: sets each fix in `os.environ` unless the variable is already set;
- `greta-env.pth`: imports `_greta_env` at every start-up (Python's `site` runs it).

So a plain `python script.py` in a new shell gets the fixes, while a value the user
exports explicitly still wins. `GRETA_ENV_DISABLE=1` skips them for one run;
`greta env --clear` removes the files.

The files are data that must never become code or crash an interpreter: only variable
names from an allowlist of GPU-runtime prefixes are ever set (never LD_PRELOAD, PATH or
PYTHON*), the JSON is read with a size cap, and the start-up hook swallows every error
(`greta doctor` and `greta env` report a bad file instead). `greta env` prints only valid
names with quoted values and one-line comments, so `eval "$(greta env)"` is safe for
any file content.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from greta_install.boundedio import ENV_FILE_MAX_BYTES, read_bytes
from greta_install.errors import GretaError

JSON_NAME = "greta-env.json"
PTH_NAME = "greta-env.pth"
HOOK_NAME = "_greta_env.py"
FILES = (JSON_NAME, HOOK_NAME, PTH_NAME)
ENV_SCHEMA = 1
MAX_VALUE_CHARS = 4096
MAX_VARIABLES = 64

# The variables GRETA may set: GPU runtimes, frameworks, GRETA itself. Nothing that
# changes what the dynamic loader or Python loads (LD_*, PATH, PYTHON*).
ALLOWED_PREFIXES = (
    "HSA_", "HIP_", "ROCR_", "ROCM_", "ROCBLAS_", "HIPBLASLT_", "MIOPEN_", "AMD_", "GPU_",
    "CUDA_", "NCCL_", "RCCL_", "NVIDIA_", "PYTORCH_", "TORCH_", "TRITON_", "XLA_", "JAX_",
    "GRETA_", "OMP_", "MKL_",
)  # fmt: skip
_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
# A name with one of these words names a program, library, module, path, index, URL or
# file sink (TRITON_PTXAS_PATH, XLA_FLAGS=--xla_dump_to, TRITON_CACHE_MANAGER=mod:Class,
# HSA_TOOLS_LIB, GRETA_KERNEL_INDEX), or is one of GRETA's test hooks: never persisted.
DENIED_WORDS = frozenset(
    [
        "PATH",
        "PATHS",
        "DIR",
        "DIRS",
        "FILE",
        "FILES",
        "HOME",
        "ROOT",
        "PREFIX",
        "URL",
        "URI",
        "INDEX",
        "HOST",
        "PROXY",
        "ENDPOINT",
        "SOCKET",
        "EXE",
        "BIN",
        "CMD",
        "COMMAND",
        "SHELL",
        "CC",
        "CXX",
        "PTXAS",
        "LLD",
        "LINKER",
        "COMPILER",
        "LIB",
        "LIBS",
        "LIBRARY",
        "PRELOAD",
        "PLUGIN",
        "PLUGINS",
        "MODULE",
        "MANAGER",
        "BACKEND",
        "CLASS",
        "HOOK",
        "SCRIPT",
        "CACHE",
        "DUMP",
        "LOG",
        "LOGS",
        "TRACE",
        "OUTPUT",
        "FLAGS",
        "OPTS",
        "OPTIONS",
        "ARGS",
        "TEST",
        "CHECKPOINT",
        "INJECTION",
        "DB",
    ]
)
# Switches and numbers, lists of them: no '/' or '\\' (paths, URLs), no spaces (argument
# lists), nothing a shell or a loader reads as more.
_VALUE = re.compile(r"[A-Za-z0-9_.,:=+-]*")


def name_refusal(key: object) -> str | None:
    """Why GRETA never sets the variable `key`, or None when it may."""
    if not (isinstance(key, str) and len(key) <= 128 and _NAME.fullmatch(key)):
        return "it is not a shell variable name"
    if not key.startswith(ALLOWED_PREFIXES):
        return "GRETA sets only GPU-runtime variables (HSA_*, HIP_*, ROCR_*, CUDA_*, ...)"
    if DENIED_WORDS.intersection(key.split("_")):
        return (
            "it names a program, library, path, index or file sink, or a test hook "
            "(GRETA sets only GPU-runtime switches)"
        )
    return None


def value_refusal(value: object) -> str | None:
    """Why GRETA never sets a variable to `value`, or None when it may."""
    if not isinstance(value, str):
        return "its value is not a string"
    if len(value) > MAX_VALUE_CHARS:
        return f"its value is {len(value)} characters, over the {MAX_VALUE_CHARS}-character limit"
    if not _VALUE.fullmatch(value):
        return (
            "its value may hold only letters, digits and . , : = + - _ "
            "(no paths, URLs, spaces or control characters)"
        )
    return None


def allowed_name(key: object) -> bool:
    """A variable name GRETA may set: a shell identifier with an allowed prefix that names
    no program, path, index, file sink or test hook."""
    return name_refusal(key) is None


def allowed_value(value: object) -> bool:
    return value_refusal(value) is None


HOOK_SOURCE = f'''"""Written by `greta install`: GRETA's environment fixes for this environment.

Sets each variable in greta-env.json at interpreter start-up unless it is already set.
Set GRETA_ENV_DISABLE=1 to skip; `greta env --clear` removes this file. It never raises:
a bad greta-env.json is reported by `greta doctor` and `greta env`, not by every Python.
"""

import os as _os
import re as _re

_PREFIXES = {ALLOWED_PREFIXES!r}
_DENIED = frozenset({sorted(DENIED_WORDS)!r})
_NAME = _re.compile(r"[A-Z_][A-Z0-9_]*")
_VALUE = _re.compile({_VALUE.pattern!r})
_MAX_BYTES = {ENV_FILE_MAX_BYTES}


def _apply():
    import json

    path = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "greta-env.json")
    fd = _os.open(path, _os.O_RDONLY | _os.O_NONBLOCK)
    try:
        import stat

        info = _os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > _MAX_BYTES:
            return
        data = _os.read(fd, _MAX_BYTES + 1)
    finally:
        _os.close(fd)
    data = json.loads(data.decode("utf-8"))
    env = data.get("env") if isinstance(data, dict) else None
    if not isinstance(env, dict) or len(env) > {MAX_VARIABLES}:
        return  # `greta env` and `greta doctor` report it; nothing is half applied
    for key, value in env.items():
        if (
            isinstance(key, str)
            and len(key) <= 128
            and _NAME.fullmatch(key)
            and key.startswith(_PREFIXES)
            and not _DENIED.intersection(key.split("_"))
            and isinstance(value, str)
            and len(value) <= {MAX_VALUE_CHARS}
            and _VALUE.fullmatch(value)
            and key not in _os.environ
        ):
            _os.environ[key] = value


if _os.environ.get("GRETA_ENV_DISABLE") != "1":
    try:
        _apply()
    except BaseException:  # never break an interpreter's start-up (deep JSON included)
        pass
'''

# One line: `site` executes .pth lines that start with "import". A missing or broken
# helper module must not print a traceback at every start-up either.
PTH_SOURCE = 'import sys; exec("try:\\n import _greta_env\\nexcept BaseException:\\n pass")\n'


class EnvFixError(GretaError):
    """The persisted fixes are unreadable or cannot be written."""


def _atomic_write(path: Path, text: str) -> None:
    # ".tmp" prefix: an undo sweeps what a killed write left (transaction._TEMP_PREFIXES).
    fd, tmp = tempfile.mkstemp(prefix=f".tmp.{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def env_refusal(env: Mapping[object, object]) -> str | None:
    """Why this set of variables is never persisted or applied (the first reason), or None.
    The one rule: lock lines, `greta env`, the install and the start-up hook all keep it."""
    if len(env) > MAX_VARIABLES:
        return f"it sets {len(env)} variables, over the limit of {MAX_VARIABLES}"
    for key, value in env.items():
        why = name_refusal(key) or value_refusal(value)
        if why:
            return f"{str(key)[:60]!r}: {why}"
    return None


def validate_env(env: Mapping[str, str]) -> None:
    why = env_refusal(env)
    if why:
        raise EnvFixError(f"refusing to persist the environment fixes: {why}")


def write_env_fixes(
    site_packages: Path,
    env: Mapping[str, str],
    why: Mapping[str, str] | None = None,
    target: str | None = None,
    arch: str | None = None,
) -> list[Path]:
    """Persist `env` in the environment; an empty env removes any earlier fixes."""
    if not env:
        clear_env_fixes(site_packages)
        return []
    validate_env(env)
    data: dict[str, Any] = {
        "schema": ENV_SCHEMA,
        "target": target,
        "arch": arch,
        "env": dict(sorted(env.items())),
        "why": {k: (why or {}).get(k, "") for k in sorted(env)},
    }
    try:
        site_packages.mkdir(parents=True, exist_ok=True)
        _atomic_write(site_packages / JSON_NAME, json.dumps(data, indent=2) + "\n")
        _atomic_write(site_packages / HOOK_NAME, HOOK_SOURCE)
        _atomic_write(site_packages / PTH_NAME, PTH_SOURCE)
    except OSError as exc:
        raise EnvFixError(
            f"cannot write the environment fixes into {site_packages}: {exc}"
        ) from None
    return [site_packages / n for n in FILES]


def read_env_fixes(site_packages: Path) -> dict[str, Any] | None:
    """The persisted record, or None when this environment has none. EnvFixError when it
    is unreadable, too large, not UTF-8, too deep, or names a variable GRETA never sets."""
    path = site_packages / JSON_NAME
    try:
        raw = read_bytes(path, ENV_FILE_MAX_BYTES)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise EnvFixError(
            f"cannot read {path}: {exc}; remove it with `greta env --clear`"
        ) from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise EnvFixError(
            f"{path} is corrupt ({exc.__class__.__name__}); remove it with `greta env --clear`"
        ) from None
    env = data.get("env") if isinstance(data, dict) else None
    if not isinstance(env, dict):
        raise EnvFixError(f"{path} has no valid `env` table; remove it with `greta env --clear`")
    why = env_refusal(env)
    if why:
        raise EnvFixError(f"{path} is refused ({why}); remove it with `greta env --clear`")
    why = data.get("why")
    data["why"] = (
        {k: v for k, v in why.items() if isinstance(v, str)} if isinstance(why, dict) else {}
    )
    return data


def clear_env_fixes(site_packages: Path) -> list[Path]:
    removed = []
    for name in (PTH_NAME, HOOK_NAME, JSON_NAME):
        path = site_packages / name
        if path.is_dir() and not path.is_symlink():
            raise EnvFixError(
                f"{path} is a folder, not a file GRETA wrote; nothing was removed. "
                f"Look at it, then remove it with: rm -r -- {shlex.quote(str(path))}"
            )
    for name in (PTH_NAME, HOOK_NAME, JSON_NAME):
        path = site_packages / name
        if path.exists() or path.is_symlink():
            path.unlink()
            removed.append(path)
    return removed


def _comment(text: str) -> str:
    """One line of printable text, safe after `#` in a shell script."""
    flat = "".join(c if c.isprintable() else " " for c in text)
    return " ".join(flat.split())[:300]


def format_exports(env: Mapping[str, str], why: Mapping[str, str] | None = None) -> str:
    """Shell exports safe to `eval` whatever the mapping holds: invalid names are left
    out, values are quoted, reasons become single-line comments."""
    lines = []
    for key in sorted(env):
        value = env[key]
        if not (allowed_name(key) and allowed_value(value)):
            continue
        reason = _comment(str((why or {}).get(key, "")))
        if reason:
            lines.append(f"# {reason}")
        lines.append(f"export {key}={shlex.quote(value)}")
    return "\n".join(lines) + ("\n" if lines else "")
