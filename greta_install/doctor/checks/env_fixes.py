"""The environment fixes `greta install` persisted: readable, or reported here.

The start-up hook never raises (a bad file must not break every interpreter start), so
this check is where a corrupt or hostile `greta-env.json` is reported.
"""

from __future__ import annotations

from greta_install.doctor.facts import Facts
from greta_install.doctor.model import Finding, ok, skip, warn

from ._common import needs_live


def check_env_fixes(facts: Facts) -> Finding:
    if (skipped := needs_live(facts)) or facts.env_fixes is None:
        return skipped or skip("the environment fixes were not read")
    if facts.env_fixes == "absent":
        return ok("no persisted environment fixes in this environment")
    if facts.env_fixes == "ok":
        return ok("the persisted environment fixes are readable (see `greta env`)")
    return warn(
        f"the persisted environment fixes are ignored at start-up: {facts.env_fixes}",
        "greta env --clear && greta install",
    )
