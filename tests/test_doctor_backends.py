"""The doctor's summary of the NVIDIA -> AMD library mapping (greta_core.backends)."""

from __future__ import annotations

from greta_install.doctor.checks.backends_checks import check_backends
from greta_install.doctor.facts import Facts


def _entry(status: str, finding: str, fix: str = "") -> dict[str, str]:
    return {"id": f"backends.{finding[:5]}", "status": status, "finding": finding, "fix": fix}


def test_all_present_is_ok() -> None:
    facts = Facts(live=True, backends=[_entry("ok", "cuBLAS -> hipBLASLt: cuBLAS 13.1")])
    result = check_backends(facts)
    assert result.status == "ok"
    assert "cuBLAS 13.1" in result.finding


def test_missing_gpu_library_warns_with_its_fix() -> None:
    facts = Facts(
        live=True,
        backends=[
            _entry("ok", "cuDNN -> MIOpen: MIOpen 3.4"),
            _entry(
                "warn",
                "FlashAttention -> AOTriton / CK: absent",
                "export TORCH_ROCM_FA_PREFER_CK=1",
            ),
        ],
    )
    result = check_backends(facts)
    assert result.status == "warn"
    assert result.fix == "export TORCH_ROCM_FA_PREFER_CK=1"
    assert "MIOpen 3.4" in result.finding and "absent" in result.finding


def test_probe_failure_fails_and_snapshot_skips() -> None:
    failed = Facts(
        live=True, backends=[_entry("fail", "the backend probe exited with 1", "greta backends")]
    )
    assert check_backends(failed).status == "fail"
    assert check_backends(Facts(live=False)).status == "skip"
    assert check_backends(Facts(live=True)).status == "skip"  # torch did not import
