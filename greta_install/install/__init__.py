"""The install transaction: `greta install` as a pipeline of named steps.

prepare.py gathers the facts at the edge and builds the plan; installer.py stages and
verifies every file; transaction.py journals every change so a failure undoes it all;
steps.py and step_*.py are the post-commit steps (kernel wheel, smoke test, hashes);
only.py runs the post-install steps alone (`greta install --only`). smoke_child.py runs
as a child in the target environment's Python, never imported by the installer.
"""
