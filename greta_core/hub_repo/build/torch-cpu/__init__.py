"""GRETA's layers as a kernels build variant (see greta_core/hub.py)."""

from greta_core import hub as layers  # noqa: F401
