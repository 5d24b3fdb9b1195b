"""Reading files GRETA does not control: regular files only, never more than a cap.

A lock named `/dev/zero`, a FIFO named `rocminfo.txt` or a 300 MB `greta-env.json` must be
a clear error, not an out-of-memory kill or a hang. Opening with O_NONBLOCK makes a FIFO
open return at once; `fstat` then refuses anything that is not a regular file.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from greta_install.errors import GretaError

LOCK_MAX_BYTES = 4 * 1024 * 1024
ENV_FILE_MAX_BYTES = 1024 * 1024
SUMS_MAX_BYTES = 1024 * 1024
PAGE_MAX_BYTES = 16 * 1024 * 1024


class BoundedReadError(GretaError, OSError):
    """Not a regular file, or larger than the cap; the message names the path."""


def read_bytes(
    path: str | os.PathLike[str],
    cap: int,
    *,
    follow_symlinks: bool = True,
    truncate: bool = False,
) -> bytes:
    """The bytes of a regular file, at most `cap` of them.

    Raises FileNotFoundError/OSError like open(), BoundedReadError for a FIFO, device,
    directory or socket, and for a file over `cap` unless `truncate` (then its first `cap`
    bytes: /sys and /proc files report sizes that mean nothing).
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    fd = os.open(path, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise BoundedReadError(f"{path} is not a regular file")
        if info.st_size > cap and not truncate:
            raise BoundedReadError(f"{path} is {info.st_size} bytes, over the {cap}-byte limit")
        os.set_blocking(fd, True)
        chunks = []
        left = cap + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if len(data) > cap:
        if not truncate:
            raise BoundedReadError(f"{path} is over the {cap}-byte limit")
        data = data[:cap]
    return data


def read_text(path: str | os.PathLike[str], cap: int, **kwargs: bool) -> str:
    """UTF-8 text of a regular file of at most `cap` bytes (UnicodeDecodeError otherwise)."""
    return read_bytes(path, cap, **kwargs).decode("utf-8")


def is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except OSError:
        return False
