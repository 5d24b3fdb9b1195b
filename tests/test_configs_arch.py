"""Launch-config tables (rule matching, fallback to default.json) and GPU arch names."""

from __future__ import annotations

from typing import Any

import pytest

from greta_core import configs
from greta_core.arch import normalize_arch, warp_size

# --- arch normalisation: what torch, rocminfo, JAX and users write -> one spelling ----------


@pytest.mark.parametrize(
    ("written", "normal"),
    [
        ("gfx942", "gfx942"),
        ("gfx942:sramecc+:xnack-", "gfx942"),  # rocminfo / torch gcnArchName
        ("GFX1100", "gfx1100"),
        ("  gfx1201\n", "gfx1201"),
        ("gfx90a:xnack+", "gfx90a"),
        ("sm_90", "sm_90"),
        ("sm90", "sm_90"),
        ("SM_90", "sm_90"),
        ("90", "sm_90"),
        ("9.0", "sm_90"),  # JAX's compute_capability
        ("8.6", "sm_86"),
        ("12.0", "sm_120"),
        ("sm_120", "sm_120"),
    ],
)
def test_normalize_arch(written: str, normal: str) -> None:
    assert normalize_arch(written) == normal


@pytest.mark.parametrize("bad", ["", "cuda", "hopper", "sm_", "9.0.1", "rtx4090"])
def test_normalize_arch_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match="unrecognised GPU arch"):
        normalize_arch(bad)


@pytest.mark.parametrize(
    ("arch", "lanes"),
    [
        ("gfx942", 64),
        ("gfx90a", 64),
        ("gfx906", 64),
        ("gfx1100", 32),
        ("gfx1201", 32),
        ("sm_90", 32),
    ],
)
def test_warp_size(arch: str, lanes: int) -> None:
    assert warp_size(arch) == lanes


# --- config tables ----------------------------------------------------------------------

TABLE: dict[str, Any] = {
    "ops": {
        "norm": {
            "default": {"BLOCK": 1024, "num_warps": 8},
            "rules": [
                {"when": {"N_max": 256}, "config": {"BLOCK": 256, "num_warps": 1}},
                {"when": {"N_max": 1024, "dtype": "fp16"}, "config": {"num_warps": 2}},
                {"when": {"N_min": 8192, "M_min": 4}, "config": {"BLOCK": 4096}},
                {"when": {"N_max": 2048}, "config": {"num_warps": 4}},
            ],
        },
    }
}
DEFAULT_TABLE: dict[str, Any] = {
    "ops": {"norm": {"default": {"BLOCK": 64}}, "only_default": {"default": {"BLOCK": 32}}}
}


@pytest.fixture
def tables(monkeypatch: pytest.MonkeyPatch) -> None:
    def load(arch: str) -> dict[str, Any]:
        return DEFAULT_TABLE if arch == "default" else TABLE

    monkeypatch.setattr(configs, "load_table", load)


@pytest.mark.parametrize(
    ("features", "config"),
    [
        ({"N": 256}, {"BLOCK": 256, "num_warps": 1}),  # _max is inclusive
        ({"N": 257}, {"BLOCK": 1024, "num_warps": 4}),  # first rule out, last rule in
        ({"N": 1000, "dtype": "fp16"}, {"BLOCK": 1024, "num_warps": 2}),  # exact value
        ({"N": 1000, "dtype": "bf16"}, {"BLOCK": 1024, "num_warps": 4}),
        ({"N": 100, "dtype": "fp16"}, {"BLOCK": 256, "num_warps": 1}),  # first match wins
        ({"N": 8192, "M": 4}, {"BLOCK": 4096, "num_warps": 8}),  # _min is inclusive
        ({"N": 8192, "M": 3}, {"BLOCK": 1024, "num_warps": 8}),  # every key must hold
        ({"N": 8192}, {"BLOCK": 1024, "num_warps": 8}),  # a missing feature never matches
        ({}, {"BLOCK": 1024, "num_warps": 8}),
    ],
)
def test_first_matching_rule_is_merged_over_the_default(
    tables: None, features: dict[str, Any], config: dict[str, Any]
) -> None:
    assert configs.lookup("norm", "gfx942", features) == config


def test_lookup_never_mutates_the_table(tables: None) -> None:
    configs.lookup("norm", "gfx942", {"N": 10})["BLOCK"] = -1
    assert TABLE["ops"]["norm"]["default"] == {"BLOCK": 1024, "num_warps": 8}


def test_op_missing_from_the_arch_table_falls_back_to_default(tables: None) -> None:
    assert configs.lookup("only_default", "gfx1100", {"N": 1}) == {"BLOCK": 32}


def test_op_missing_everywhere_is_a_config_error(tables: None) -> None:
    with pytest.raises(configs.ConfigError, match="no launch config for op 'nope'"):
        configs.lookup("nope", "sm_90")


def test_unknown_arch_reads_the_shipped_default_table() -> None:
    # No table (and no kernel wheel) for gfx1030: the shipped default.json answers.
    configs.load_table.cache_clear()
    assert configs.load_table("gfx1030") == configs.load_table("default")
    assert configs.load_table("gfx942") != configs.load_table("default")


def test_shipped_tables_split_launch_options_from_block_sizes() -> None:
    config = configs.lookup("rms_norm", "gfx942", {"N": 512})
    options = configs.launch_options(config, "gfx942")
    assert options and set(options) <= configs.LAUNCH_OPTIONS
    assert set(configs.meta_params(config)).isdisjoint(configs.LAUNCH_OPTIONS)
    hip_only = {"num_warps": 4, "waves_per_eu": 2, "BLOCK": 8}
    assert configs.launch_options(hip_only, "gfx942") == {"num_warps": 4, "waves_per_eu": 2}
    assert configs.launch_options(hip_only, "sm_90") == {"num_warps": 4}
