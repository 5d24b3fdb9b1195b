"""GRETA installer half: detection, the locked version matrix, install and doctor.

Depends only on the standard library and `packaging` (+ `tomli` below Python 3.11):
it runs before torch and jax exist. Folders follow the data, each a layer that imports
only the ones below it (docs/en/architecture.md, enforced by tests/test_layers.py):
detection/, environment/ -> locks/ -> plan/ -> install/; doctor/ beside install/;
commands/ on top. The top-level modules are the foundation they all read.
"""
