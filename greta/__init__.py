"""GRETA: the `greta` command line. The work lives in `greta_install` and `greta_core`."""

__version__ = "0.1.0"
