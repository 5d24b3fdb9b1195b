"""GRETA installer half: detection, the locked version matrix, install and doctor.

Depends only on the standard library and `packaging` (+ `tomli` below Python 3.11):
it runs before torch and jax exist.
"""
