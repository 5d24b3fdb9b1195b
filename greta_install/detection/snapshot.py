"""`greta snapshot`: copy what detection reads from the live machine into a directory.

The directory is the file a user attaches to a bug report, so it holds only what
detection reads: the vendor tools' output, the KFD topology and DRM device files,
the NVIDIA and ROCm version files, the relevant environment variables, and a small
meta.json. Serial numbers, UUIDs and unique ids are replaced by "REDACTED". It is
written to a temporary directory next to the destination and renamed into place, so a
failed snapshot leaves nothing half-written.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from greta_install.detection.evidence import (
    AMDGPU_MODULE_VERSION,
    DRM_CLASS,
    KFD_NODES,
    NVIDIA_VERSION,
    ROCM_VERSION_FILE,
)
from greta_install.detection.parsers.drm import CARD_FILES
from greta_install.detection.system_view import (
    SNAPSHOT_FILES,
    TOOL_COMMANDS,
    SystemView,
    scrub_cmdline,
)
from greta_install.errors import SnapshotExistsError
from greta_install.version import __version__

KFD_NODE_FILES: tuple[str, ...] = ("properties", "name", "gpu_id")
_CARD = re.compile(r"^card\d+$")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
# "Serial Number : 1654423001593", "GPU UUID : GPU-...", "ASIC_SERIAL: 0x7E8F...",
# rocm-smi "Unique ID: 0x8d14...", KFD "unique_id 1801979520617338022".
_PRIVATE = re.compile(
    r"^(?P<key>[^\n]*?(?:serial|uuid|unique[ _]id)[^\n:]*:[ \t]*)(?P<value>\S[^\n]*)$",
    re.IGNORECASE | re.MULTILINE,
)
_PRIVATE_KFD = re.compile(r"^(?P<key>unique_id[ \t]+)(?P<value>\S+)$", re.MULTILINE)


def redact(text: str) -> str:
    """The text with identifying values (serials, UUIDs, unique ids) replaced."""
    text = scrub_cmdline(_PRIVATE.sub(lambda m: f"{m['key']}REDACTED", text))
    return _PRIVATE_KFD.sub(lambda m: f"{m['key']}REDACTED", text)


# Where the files a snapshot copies may really live. A symlink elsewhere (a ROCm version
# file linked to /etc/shadow) is not followed: the bundle is meant to be shared.
_REAL_PREFIXES = ("/sys/", "/proc/", "/opt/", "/usr/")


def _confined(view: SystemView, path: str, extra_prefix: str | None = None) -> bool:
    """`path`, symlinks resolved, stays in the places such files live and keeps its name."""
    if not view.is_live:
        return True  # a SnapshotSystem already keeps reads inside its directory
    root = os.path.realpath(getattr(view, "_root", "/"))
    real = os.path.realpath(os.path.join(root, path.lstrip("/")))
    if real != root and not real.startswith(root.rstrip("/") + "/"):
        return False
    machine_path = "/" + os.path.relpath(real, root)
    prefixes = _REAL_PREFIXES + ((extra_prefix,) if extra_prefix else ())
    return machine_path.startswith(prefixes) and os.path.basename(real) == os.path.basename(path)


def _copy(
    view: SystemView, root: Path, path: str, written: list[str], extra_prefix: str | None = None
) -> None:
    if not _confined(view, path, extra_prefix):
        return
    text = view.read_text(path)
    if text is None:
        return
    dest = root / path.lstrip("/")
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(redact(text), encoding="utf-8")
    written.append(path.lstrip("/"))


def _write(view: SystemView, root: Path) -> list[str]:
    written: list[str] = []
    for tool in TOOL_COMMANDS:
        output = view.run(tool)
        if output is not None:
            (root / f"{tool}.txt").write_text(redact(output), encoding="utf-8")
            written.append(f"{tool}.txt")
    for node in view.list_dir(KFD_NODES):
        if _SAFE_NAME.match(node):
            for name in KFD_NODE_FILES:
                _copy(view, root, f"{KFD_NODES}/{node}/{name}", written)
    for card in view.list_dir(DRM_CLASS):
        if _CARD.match(card):
            for name in CARD_FILES:
                _copy(view, root, f"{DRM_CLASS}/{card}/device/{name}", written)
    for path in (NVIDIA_VERSION, ROCM_VERSION_FILE, AMDGPU_MODULE_VERSION, *SNAPSHOT_FILES):
        _copy(view, root, path, written)
    env = dict(view.env())
    rocm_path = env.get("ROCM_PATH")
    if rocm_path and rocm_path.startswith("/") and rocm_path.rstrip("/") != "/opt/rocm":
        view_root = os.path.realpath(getattr(view, "_root", "/"))
        real_rocm = os.path.realpath(os.path.join(view_root, rocm_path.lstrip("/")))
        real_rocm = "/" + os.path.relpath(real_rocm, view_root).rstrip("/") + "/"
        _copy(view, root, rocm_path.rstrip("/") + "/.info/version", written, real_rocm)
    (root / "env.json").write_text(json.dumps(env, indent=1, sort_keys=True) + "\n", "utf-8")
    meta = {
        "greta_version": __version__,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "files": sorted(written),
    }
    (root / "meta.json").write_text(json.dumps(meta, indent=1) + "\n", "utf-8")
    return sorted([*written, "env.json", "meta.json"])


def write_snapshot(view: SystemView, directory: str | os.PathLike[str]) -> list[str]:
    """Write a snapshot of ``view`` into ``directory`` (absent or empty); return its files.

    Raises SnapshotExistsError (a FileExistsError) when the directory exists and is not empty, OSError when it
    cannot be written; nothing is left behind in either case.
    """
    target = Path(directory)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise SnapshotExistsError(f"{target} already exists and is not an empty directory")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        files = _write(view, tmp)
        if target.exists():
            target.rmdir()
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return files
