"""`greta doctor`: explain what is wrong with this machine's AI stack, and how to fix it.

collect.py gathers facts (all side effects), checks/ judges them (pure functions),
runner.py runs the checks, render.py prints the report.
"""

from greta_install.doctor.model import CheckResult, exit_code, summarize

__all__ = ["CheckResult", "exit_code", "summarize"]
