"""configs.Override: what tuning and benchmarks use to try a config without editing tables."""

from __future__ import annotations

from greta_core import configs


def test_override_merges_over_the_named_op_only_and_restores() -> None:
    table = configs.lookup
    base = configs.lookup("linear_cross_entropy", "sm_90", {"V": 128256})
    other = configs.lookup("rms_norm", "sm_90", {"N": 4096})
    override = configs.Override({"linear_cross_entropy": {"CHUNK_SCALE": 8}})
    with override:
        assert configs.lookup("linear_cross_entropy", "sm_90", {"V": 128256}) == {
            **base,
            "CHUNK_SCALE": 8,
        }
        assert configs.lookup("rms_norm", "sm_90", {"N": 4096}) == other
        inside = configs.lookup
    assert configs.lookup is table
    with override:  # entered again: the same lookup, so plan and call caches hit again
        assert configs.lookup == inside


def test_override_reads_its_mapping_on_every_lookup() -> None:
    current: dict[str, int] = {}
    with configs.Override({"swiglu": current}):
        plain = configs.lookup("swiglu", "sm_90", {})
        current["BLOCK"] = 64
        assert configs.lookup("swiglu", "sm_90", {}) == {**plain, "BLOCK": 64}
