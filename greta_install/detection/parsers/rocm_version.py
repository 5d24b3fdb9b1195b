"""ROCm user-space version: ``/opt/rocm/.info/version`` ("6.4.1-120") and
``hipconfig --version`` ("6.4.43484-123eb5128", the HIP version: its major.minor is
the ROCm release's)."""

from __future__ import annotations

import re

from packaging.version import InvalidVersion, Version

from greta_install.detection.parsers.common import Parsed, safe_parse

_VERSION = re.compile(r"^\s*(\d+\.\d+(?:\.\d+)?)")


def _checked(raw: str) -> str | None:
    match = _VERSION.match(raw)
    if not match:
        return None
    try:
        return str(Version(match.group(1)))
    except InvalidVersion:
        return None


def parse_info_version(text: str | None) -> Parsed[str]:
    """The ROCm version from the ``.info/version`` file."""

    def body(clean_text: str, out: Parsed[str]) -> None:
        first = clean_text.strip().splitlines()[0] if clean_text.strip() else ""
        version = _checked(first)
        if version:
            out.records.append(version)
        elif first:
            out.problems.append(f"rocm version file: not a version: {first[:40]!r}")

    return safe_parse("rocm-version", text, body)


def parse_hipconfig(text: str | None) -> Parsed[str]:
    """The ROCm release (major.minor) from ``hipconfig --version``."""

    def body(clean_text: str, out: Parsed[str]) -> None:
        lines = [ln for ln in clean_text.splitlines() if ln.strip()]
        for line in lines:
            version = _checked(line)
            if version:
                release = Version(version).release
                out.records.append(f"{release[0]}.{release[1] if len(release) > 1 else 0}")
                return
        if lines:
            out.problems.append(f"hipconfig: no version in {lines[0][:40]!r}")

    return safe_parse("hipconfig", text, body)
