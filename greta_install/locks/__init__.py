"""The locked version matrix: lock/matrix.toml (matrix.py), which row installs an arch
(routing.py), per-target lock files (lockfile.py, written by lockgen.py for `greta lock`),
their PEP 751 form (pylock.py), the vendor-index probe and the generated version docs.

Reads the foundation and the environment layer's envfix rules; knows nothing of the
machine (detection) or of installing.
"""
