"""Environment fixes that persist inside the target environment.

`greta install` writes three files into the environment's site-packages:

- `greta-env.json`: the fixes (and why each is needed);
- `_greta_env.py`: sets each fix in `os.environ` unless the variable is already set;
- `greta-env.pth`: `import _greta_env`, which Python's `site` runs at every start-up.

So a plain `python script.py` in a new shell gets the fixes, while a value the user
exports explicitly still wins. `GRETA_ENV_DISABLE=1` skips them for one run;
`greta env --clear` removes the files.
"""

from __future__ import annotations

import json
import os
import shlex
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from greta_install.errors import GretaError

JSON_NAME = "greta-env.json"
PTH_NAME = "greta-env.pth"
HOOK_NAME = "_greta_env.py"
ENV_SCHEMA = 1

HOOK_SOURCE = '''"""Written by `greta install`: GRETA's environment fixes for this environment.

Sets each variable in greta-env.json at interpreter start-up unless it is already set.
Set GRETA_ENV_DISABLE=1 to skip; `greta env --clear` removes this file.
"""

import json as _json
import os as _os


def _apply() -> None:
    path = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "greta-env.json")
    try:
        with open(path, encoding="utf-8") as fh:
            data = _json.load(fh)
    except (OSError, ValueError):
        return
    env = data.get("env") if isinstance(data, dict) else None
    if not isinstance(env, dict):
        return
    for key, value in env.items():
        if isinstance(key, str) and isinstance(value, str) and key not in _os.environ:
            _os.environ[key] = value


if _os.environ.get("GRETA_ENV_DISABLE") != "1":
    _apply()
'''


class EnvFixError(GretaError):
    """The persisted fixes are unreadable or cannot be written."""


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
        _atomic_write(site_packages / PTH_NAME, "import _greta_env\n")
    except OSError as exc:
        raise EnvFixError(
            f"cannot write the environment fixes into {site_packages}: {exc}"
        ) from None
    return [site_packages / n for n in (JSON_NAME, HOOK_NAME, PTH_NAME)]


def read_env_fixes(site_packages: Path) -> dict[str, Any] | None:
    """The persisted record, or None when this environment has none."""
    path = site_packages / JSON_NAME
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise EnvFixError(f"cannot read {path}: {exc}") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise EnvFixError(
            f"{path} is corrupt ({exc}); remove it with `greta env --clear`"
        ) from None
    env = data.get("env") if isinstance(data, dict) else None
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise EnvFixError(f"{path} has no valid `env` table; remove it with `greta env --clear`")
    return data


def clear_env_fixes(site_packages: Path) -> list[Path]:
    removed = []
    for name in (PTH_NAME, HOOK_NAME, JSON_NAME):
        path = site_packages / name
        if path.exists():
            path.unlink()
            removed.append(path)
    return removed


def format_exports(env: Mapping[str, str], why: Mapping[str, str] | None = None) -> str:
    lines = []
    for key in sorted(env):
        reason = (why or {}).get(key)
        if reason:
            lines.append(f"# {reason}")
        lines.append(f"export {key}={shlex.quote(env[key])}")
    return "\n".join(lines) + ("\n" if lines else "")
