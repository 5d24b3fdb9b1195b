"""The one base of every error GRETA raises: ``except GretaError`` catches them all.

A leaf (standard library only): the installer half, the CLI and ``greta_core.errors``
import it. Each error also keeps the builtin base its callers catch (``ValueError`` for
bad input, ``RuntimeError`` for a failed step, ...).
"""

from __future__ import annotations


class GretaError(Exception):
    """Base of every error GRETA raises."""


class InterpreterError(GretaError, ValueError):
    """A Python interpreter (``--python``) could not be run or queried."""


class SnapshotNotFoundError(GretaError, FileNotFoundError):
    """A ``--snapshot`` directory that does not exist."""


class SnapshotExistsError(GretaError, FileExistsError):
    """A snapshot target directory that already exists and is not empty."""


class UnknownTorchBuildError(GretaError, KeyError):
    """A matrix row names a torch build the arch table does not know."""
