"""``/proc/driver/nvidia/version``: the loaded kernel module's version.

``NVRM version: NVIDIA UNIX x86_64 Kernel Module  565.57.01  Thu Oct 10 ...`` or, for
the open modules, ``NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  565.57.01 ...``.
"""

from __future__ import annotations

import re

from greta_install.detection.parsers.common import Parsed, safe_parse

_NVRM = re.compile(r"NVRM version:.*?Kernel Module(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)?)")


def parse(text: str | None) -> Parsed[str]:
    def body(clean_text: str, out: Parsed[str]) -> None:
        match = _NVRM.search(clean_text)
        if match:
            out.records.append(match.group(1))
        elif clean_text.strip():
            out.problems.append("nvidia driver version file: no 'NVRM version' line")

    return safe_parse("nvidia-proc", text, body)
