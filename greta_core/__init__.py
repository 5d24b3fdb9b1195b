"""GRETA kernels: LLM primitives written once in Triton, exposed to Triton, PyTorch and JAX.

Frameworks are imported lazily: importing `greta_core` costs nothing.
"""

from greta_install.version import __version__  # one version for both halves

__all__ = ["__version__"]
