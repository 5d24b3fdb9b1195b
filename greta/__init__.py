"""GRETA: the `greta` command line. The work lives in `greta_install` and `greta_core`."""

from greta_install.version import __version__

__all__ = ["__version__"]
