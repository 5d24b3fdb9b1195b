"""Small facts about AMD gfx names that several checks share."""

from __future__ import annotations

import re

from greta_install import archs
from greta_install.archs import override_to_gfx

__all__ = [
    "SIBLING_OVERRIDES",
    "UNOFFICIAL_OVERRIDES",
    "base_arch",
    "gfx_to_override",
    "is_amd_arch",
    "override_to_gfx",
    "wheel_archs",
]

# Derived from greta_install.archs, the one table of arch facts that detection and the
# install plan read too. Experimental overrides exist but GRETA never sets them (the
# doctor warns); sibling overrides are every override known to run an arch.
UNOFFICIAL_OVERRIDES: dict[str, str] = {
    gfx: value for gfx in archs.FAMILY if (value := archs.experimental_override(gfx)) is not None
}
SIBLING_OVERRIDES: dict[str, str] = {
    gfx: value for gfx in archs.FAMILY if (value := archs.known_override(gfx)) is not None
}


def gfx_to_override(arch: str) -> str | None:
    """ "gfx1030" -> "10.3.0", "gfx90a" -> "9.0.10"; None for names that are not gfx."""
    match = re.match(r"^gfx(\d{1,2})([0-9a-f])([0-9a-f])$", base_arch(arch) or "")
    if not match:
        return None
    return f"{int(match.group(1))}.{int(match.group(2), 16)}.{int(match.group(3), 16)}"


def base_arch(arch: str | None) -> str | None:
    """ "gfx90a:sramecc+:xnack-" -> "gfx90a"."""
    if not arch:
        return None
    return arch.split(":", 1)[0].strip().lower() or None


def wheel_archs(arch_list: list[str] | tuple[str, ...]) -> set[str]:
    return {a for a in (base_arch(x) for x in arch_list) if a}


def is_amd_arch(arch: str | None) -> bool:
    base = base_arch(arch)
    return bool(base and base.startswith("gfx"))
