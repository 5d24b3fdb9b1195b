"""Per-arch routing: each AMD arch installs a torch whose build carries its code.

The arch lists are the arch table's (greta_install/archs.py, TORCH_BUILDS); these tests
plan installs through the real CLI (`greta install --dry-run --json`) and check the
torch it would install comes from a build whose recorded arch list holds the arch.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from greta import cli
from greta_install import archs
from greta_install.locks import routing
from greta_install.locks.matrix import load_matrix

REPO = Path(__file__).resolve().parents[1]
MATRIX = load_matrix()


def dry_run(*args: str) -> tuple[int, dict[str, Any], str]:
    """`greta install --dry-run --json ...` in this process (the CLI's own entry point)."""
    out, err = io.StringIO(), io.StringIO()
    argv = ["install", "--dry-run", "--json", "--python", "3.12", *args]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(argv)
    text = out.getvalue()
    data = json.loads(text) if text.strip().startswith("{") else {}
    return rc, data, err.getvalue()


def _torch(plan: dict[str, Any]) -> dict[str, Any]:
    (torch,) = [p for p in plan["packages"] if p["name"] == "torch"]
    return torch


def _assert_no_extra_index(plan: dict[str, Any]) -> None:
    for argv in plan["commands"]["stage"]:
        assert "--extra-index-url" not in argv
    for pkg in plan["vendor_downloads"]:
        (argv,) = [a for a in plan["commands"]["stage"] if a[-1].endswith(f"/{pkg['name']}.req")]
        assert argv[argv.index("--index-url") + 1] == pkg["index"]


@pytest.mark.parametrize("arch", ["gfx1103", "gfx1031", "gfx1032", "gfx1035", "gfx1036", "gfx1010"])
def test_archs_pytorch_org_lacks_install_amds_per_target_build(arch: str) -> None:
    rc, plan, err = dry_run("--target", "radeon", "--arch", arch)
    assert rc == 0, err
    assert plan["ready"] is True and plan["blockers"] == []
    source = plan["torch_source"]
    assert source["carries_arch"] is True and source["arch"] == arch
    build = archs.torch_build(source["build"])
    assert arch in build.archs and build.vendor == "AMD TheRock"
    assert not archs.torch_build("pytorch-rocm7.14").carries(arch)
    torch = _torch(plan)
    assert (
        torch["index"] == build.index
        and torch["index"] != "https://download.pytorch.org/whl/rocm7.14"
    )
    names = {p["name"] for p in plan["packages"]}
    # Torch's own kernels for the arch, and ROCm's device libraries of the same arch.
    assert f"amd-torch-device-{arch}" in names and f"rocm-sdk-device-{arch}" in names
    assert not any(
        n.startswith("amd-torch-device-") and n != f"amd-torch-device-{arch}" for n in names
    )
    assert "HSA_OVERRIDE_GFX_VERSION" not in plan["env"]
    assert plan["row"]["name"] == "therock" and arch in plan["row"]["why"]
    _assert_no_extra_index(plan)


@pytest.mark.parametrize(
    "args",
    [("--target", "radeon", "--arch", a) for a in ("gfx1100", "gfx1151", "gfx1201")]
    + [
        (
            "--target",
            "mi300x",
        )
    ],
)
def test_archs_pytorch_org_carries_stay_on_it(args: tuple[str, ...]) -> None:
    rc, plan, err = dry_run(*args)
    assert rc == 0, err
    assert plan["ready"] is True
    assert plan["torch_source"]["build"] == "pytorch-rocm7.14"
    assert plan["torch_source"]["carries_arch"] is True
    assert _torch(plan)["index"] == "https://download.pytorch.org/whl/rocm7.14"
    _assert_no_extra_index(plan)


def test_gfx1033_is_gated_with_its_evidence_and_a_flag() -> None:
    rc, plan, _ = dry_run("--target", "radeon", "--arch", "gfx1033")
    assert rc == 1 and plan["ready"] is False
    (blocker,) = plan["blockers"]
    assert "https://github.com/unslothai/unsloth/issues/8412" in blocker
    assert "--allow-known-bad-arch" in blocker
    rc, plan, err = dry_run("--target", "radeon", "--arch", "gfx1033", "--allow-known-bad-arch")
    assert rc == 0 and plan["ready"] is True, err
    assert any("unsloth/issues/8412" in w for w in plan["warnings"])
    assert "HSA_OVERRIDE_GFX_VERSION" not in plan["env"]  # TheRock carries gfx1033 natively


def test_gfx906_is_refused_naming_the_closest_option() -> None:
    for target in ("instinct", "radeon"):
        rc, plan, err = dry_run("--target", target, "--arch", "gfx906")
        assert rc == 2 and plan.get("packages") is None
        assert "ROCm/TheRock/issues/1844" in err and "--target cpu" in err
        assert len(err.strip().splitlines()) == 1


def test_an_arch_no_locked_build_carries_is_refused() -> None:
    rc, _, err = dry_run("--target", "radeon", "--arch", "gfx1013")
    assert rc == 2 and "--target cpu" in err and "Traceback" not in err


def test_explicit_row_is_kept_and_the_plan_says_its_build_lacks_the_arch() -> None:
    rc, plan, err = dry_run("--target", "radeon", "--arch", "gfx1103", "--row", "current")
    assert rc == 0, err
    assert plan["torch_source"]["carries_arch"] is False
    assert "HSA_OVERRIDE_GFX_VERSION" not in plan["env"]  # never for gfx1103
    assert any("therock row carries native gfx1103" in w for w in plan["warnings"])
    # The previous row runs gfx1031 through the override only because the user asked.
    rc, plan, err = dry_run("--target", "radeon", "--arch", "gfx1031", "--row", "previous")
    assert rc == 0, err
    assert plan["env"]["HSA_OVERRIDE_GFX_VERSION"] == "10.3.0"
    assert plan["torch_source"]["carries_arch"] is False


def test_route_is_pure_and_prefers_rows_in_order() -> None:
    assert routing.route(MATRIX, "radeon", "gfx1100").row == "current"
    assert routing.route(MATRIX, "radeon", "gfx1034").row == "therock"
    assert routing.route(MATRIX, "cpu", None).row == "current"
    with pytest.raises(routing.RouteError, match="belongs to target mi300x"):
        routing.route(MATRIX, "radeon", "gfx942")


def test_text_plan_names_the_source_and_why() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "greta", "install", "--dry-run", "--python", "3.12",
         "--target", "radeon", "--arch", "gfx1035"],
        capture_output=True, text=True, cwd=REPO, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "torch source: AMD TheRock" in proc.stdout
    assert "https://github.com/ROCm/pytorch/issues/3518" in proc.stdout
    assert "row therock chosen:" in proc.stdout and "does not" in proc.stdout


def test_a_row_no_vendor_index_serves_is_refused_with_the_rows_there_are() -> None:
    # ROCm 10's torch is published on no index GRETA locks from: there is no rocm10 row.
    proc = subprocess.run(
        [sys.executable, "-m", "greta", "install", "--dry-run", "--target", "radeon",
         "--arch", "gfx1151", "--row", "rocm10"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and "invalid choice: 'rocm10'" in proc.stderr
    assert "'current', 'therock', 'previous'" in proc.stderr and not proc.stdout
