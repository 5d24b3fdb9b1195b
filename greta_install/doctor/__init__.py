"""`greta doctor`: explain what is wrong with this machine's AI stack, and how to fix it.

collect.py gathers facts (all side effects), checks/ judges them (pure functions),
runner.py runs the checks, render.py prints the report. collective_run.py and
cluster_run.py are `greta doctor --collective` and `--cluster`: the command module hands
them its arguments. A layer above detection, the environment and the locks; never the
install transaction.
"""

from greta_install.doctor.model import CheckResult, exit_code, summarize

__all__ = ["CheckResult", "exit_code", "summarize"]
