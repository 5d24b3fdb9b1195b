"""Every error ``greta_core`` raises: all subclass :class:`GretaError`.

``except GretaError`` catches any of them (and the installer's: the base is shared with
``greta_install``). Each also keeps the builtin base its callers have always caught:
``GretaInputError`` is a ``ValueError``, ``GretaUnavailableError`` a ``RuntimeError``, and
so on.
"""

from __future__ import annotations

from greta_install.errors import GretaError

__all__ = [
    "AotError",
    "BenchError",
    "ConfigError",
    "GretaConfigError",
    "GretaError",
    "GretaInputError",
    "GretaTypeError",
    "GretaUnavailableError",
    "KernelWheelError",
    "NoGpuError",
    "PlanError",
    "TuneError",
    "UnknownOpError",
]


class GretaInputError(GretaError, ValueError):
    """Bad input to a GRETA function: a wrong tensor shape, dtype, device, layout or length,
    or an unknown name (arch, dtype, backend, op, preset)."""


class NoGpuError(GretaError, RuntimeError):
    """A GPU was needed (its arch, a launch) and torch sees none."""


class ConfigError(GretaError, LookupError):
    """A launch-config table is missing, malformed or has no entry for the op."""


class GretaConfigError(GretaError, ValueError):
    """A malformed force setting (API argument or GRETA_IMPL* environment variable)."""


class GretaUnavailableError(GretaError, RuntimeError):
    """A forced implementation cannot run here; never silently replaced by another."""

    def __init__(self, op: str, impl: str, reason: str) -> None:
        self.op, self.impl, self.reason = op, impl, reason
        super().__init__(f"GretaCompute: {op} implementation '{impl}' is unavailable: {reason}")


class UnknownOpError(GretaError, KeyError):
    """No GretaCompute op of that name."""


class AotError(GretaError, RuntimeError):
    """Ahead-of-time compilation (or the host-launcher build) failed."""


class KernelWheelError(GretaError, ValueError):
    """A kernel wheel is malformed: a bad path, a corrupt manifest or launcher file."""


class BenchError(GretaError):
    """A benchmark could not run or its result is unusable."""


class GretaTypeError(GretaError, TypeError):
    """A GRETA callable was called with the wrong number or kind of arguments."""


class TuneError(GretaError, ValueError):
    """Tuning produced no usable timing (or a candidate computed a different result)."""


class PlanError(GretaError, RuntimeError):
    """A launch plan an executor cannot run as written (a GRETA bug, not bad input)."""
