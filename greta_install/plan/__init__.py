"""The install plan, decided from data alone: install_plan.py builds the pure `InstallPlan`
from a matrix row, its lock and what detection saw; noop.py asks whether an environment
already matches it. Imports the locks and the environment layer, never detection: a plan
for a cloud MI300X can be made on a laptop.
"""
