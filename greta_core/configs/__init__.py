"""Per-arch launch-config tables: data, not run-time autotuning.

A table (``tables/<arch>.json``) maps each op to a ``default`` config and an ordered
list of ``rules``; the first rule whose ``when`` matches the call's features is merged
over the default. ``when`` keys are feature names with an optional ``_min``/``_max``
suffix (inclusive bounds) or an exact value::

    {"op": {"default": {"num_warps": 4},
            "rules": [{"when": {"N_max": 1024}, "config": {"num_warps": 2}}]}}

An installed GRETA kernel wheel for the arch (``greta_kernels_<arch>``) may carry a
tuned table that takes precedence over the one shipped here.
"""

from __future__ import annotations

import functools
import importlib
import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

from greta_core.arch import is_hip
from greta_core.errors import ConfigError
from greta_install.kernel_names import package_name

Features = Mapping[str, Any]

# Knobs only Triton's HIP backend accepts; passing them to the CUDA backend is an error.
HIP_ONLY_OPTIONS: frozenset[str] = frozenset({"waves_per_eu", "matrix_instr_nonkdim", "kpack"})
LAUNCH_OPTIONS: frozenset[str] = (
    frozenset({"num_warps", "num_stages", "num_ctas"}) | HIP_ONLY_OPTIONS
)


def _read_json(text: str, origin: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"config table {origin} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("ops"), dict):
        raise ConfigError(f"config table {origin} has no 'ops' mapping")
    return data


# arch -> table text that replaces every other source for that arch: set by a kernel-wheel
# build in its workers, so the wheel compiles the variants of the table it ships.
_building: dict[str, str] = {}


@functools.lru_cache(maxsize=32)
def load_table(arch: str) -> dict[str, Any]:
    """The config table for `arch`: the one a wheel build ships (``build_with_table``), else
    an installed kernel wheel's, else the shipped one, else default."""
    if arch in _building:
        return _read_json(_building[arch], f"the table built into the {arch} wheel")
    try:
        module = importlib.import_module(package_name(arch))
        wheel_table = resources.files(module).joinpath("configs.json")
        if wheel_table.is_file():
            return _read_json(wheel_table.read_text(), f"{module.__name__}/configs.json")
    except ImportError:
        pass
    shipped = _shipped(arch)
    if shipped is None:
        raise ConfigError("no default config table shipped")  # packaging bug
    name, text = shipped
    return _read_json(text, f"tables/{name}.json")


def _shipped(arch: str) -> tuple[str, str] | None:
    """(name, text) of the table greta_core ships for `arch`, else of the default table."""
    tables = resources.files(__package__).joinpath("tables")
    for name in (arch, "default"):
        candidate = tables.joinpath(f"{name}.json")
        if candidate.is_file():
            return name, candidate.read_text()
    return None


def shipped_table(arch: str) -> str:
    """The arch's config table shipped in greta_core (never an installed wheel's), as text:
    what `greta build-kernels` builds into a wheel and `greta tune` starts from."""
    shipped = _shipped(arch)
    if shipped is None:
        raise ConfigError(f"no config table for {arch}")
    return shipped[1]


def _matches(when: Mapping[str, Any], features: Features) -> bool:
    for key, bound in when.items():
        if key.endswith("_max"):
            value = features.get(key[:-4])
            if value is None or value > bound:
                return False
        elif key.endswith("_min"):
            value = features.get(key[:-4])
            if value is None or value < bound:
                return False
        elif features.get(key) != bound:
            return False
    return True


def lookup(op: str, arch: str, features: Features | None = None) -> dict[str, Any]:
    """Launch config for `op` on `arch` given shape/dtype `features`."""
    features = features or {}
    table = load_table(arch)
    entry = table["ops"].get(op)
    if entry is None and arch != "default":
        entry = load_table("default")["ops"].get(op)
    if entry is None:
        raise ConfigError(f"no launch config for op {op!r} (arch {arch})")
    config = dict(entry.get("default", {}))
    for rule in entry.get("rules", []):
        if _matches(rule.get("when", {}), features):
            config.update(rule["config"])
            break
    return config


_table_lookup = lookup


def build_with_table(arch: str, text: str | None) -> None:
    """Make `text` the config table of `arch` in this process (None: back to the usual
    lookup). Used by ``greta build-kernels`` workers: a tuned wheel compiles exactly the
    block variants its own table can request."""
    global lookup
    if text is None:
        _building.pop(arch, None)
    else:
        _read_json(text, f"the table built into the {arch} wheel")
        _building[arch] = text
    load_table.cache_clear()
    # Plans and call caches are keyed on ``configs.lookup`` itself: a new object under a
    # built table leaves every plan made from another table unreachable.
    lookup = functools.partial(_table_lookup) if _building else _table_lookup


class Override:
    """``with Override({"op": {"KEY": value}}):`` serves :func:`lookup` with these keys merged
    over the table's config of each named op (tuning and benchmarks try configs this way).

    The mapping is read on every lookup, so a caller may change it between calls. Launch
    plans and call caches are keyed on ``configs.lookup`` itself: under an Override they
    are built afresh, and the same Override entered again finds its own again.
    """

    def __init__(self, overrides: Mapping[str, Mapping[str, Any]]) -> None:
        self.overrides = overrides
        self._table_lookup: Any = None

    def lookup(self, op: str, arch: str, features: Features | None = None) -> dict[str, Any]:
        config = self._table_lookup(op, arch, features)
        extra = self.overrides.get(op)
        return {**config, **extra} if extra else config

    def __enter__(self) -> Override:
        global lookup
        self._table_lookup, lookup = lookup, self.lookup
        return self

    def __exit__(self, *exc: object) -> None:
        global lookup
        lookup = self._table_lookup


def launch_options(config: Mapping[str, Any], arch: str) -> dict[str, Any]:
    """The compiler/launch options of a config that this arch's backend accepts."""
    opts = {k: v for k, v in config.items() if k in LAUNCH_OPTIONS}
    if not is_hip(arch):
        for key in HIP_ONLY_OPTIONS:
            opts.pop(key, None)
    return opts


def meta_params(config: Mapping[str, Any]) -> dict[str, Any]:
    """The constexpr block sizes of a config (upper-case keys by convention)."""
    return {k: v for k, v in config.items() if k not in LAUNCH_OPTIONS}
