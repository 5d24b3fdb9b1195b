"""A vendor pin is downloaded from its vendor's index only, never from the default index.

Two PEP 503 indexes on 127.0.0.1 serve a package of the same name and version with
different bytes: the "default" index (named by PIP_INDEX_URL, PIP_EXTRA_INDEX_URL and a pip
configuration file, every way a user's pip can be pointed at an index) and the "vendor"
index the lock names. Staging runs the real `pip download` argv the plan shows.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from _install_helpers import Index, make_wheel

from greta_install import commandline
from greta_install.install.installer import Downloader, InstallError, stage_plan
from greta_install.plan.install_plan import PlannedPackage

NAME, VERSION = "greta-vendortest", "1.0.0"


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.fixture
def indexes(tmp_path: Path):
    filename, vendor_bytes = make_wheel(NAME, VERSION, extra={"origin.txt": b"vendor"})
    same_name, default_bytes = make_wheel(NAME, VERSION, extra={"origin.txt": b"impostor"})
    assert same_name == filename and vendor_bytes != default_bytes
    with (
        Index({filename: vendor_bytes}, {}) as vendor,
        Index({filename: default_bytes}, {}) as default,
    ):
        config = tmp_path / "pip.conf"
        config.write_text(f"[global]\nindex-url = {default.url}\nextra-index-url = {default.url}\n")
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            "PIP_INDEX_URL": default.url,
            "PIP_EXTRA_INDEX_URL": default.url,
            "PIP_CONFIG_FILE": str(config),
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        }
        yield SimpleNamespace(
            vendor=vendor, default=default, env=env, vendor_sha=_sha(vendor_bytes),
            default_sha=_sha(default_bytes),
        )  # fmt: skip


def _stage(tmp_path: Path, pkg: PlannedPackage, env: dict[str, str], reachable: bool):
    none = SimpleNamespace(status="none", location=None, requirement=None)
    plan = SimpleNamespace(blockers=[], packages=[pkg], kernel_wheel=none)
    stage = tmp_path / "stage"
    stage.mkdir(parents=True)
    downloader = Downloader(tuple(commandline.python_module(sys.executable, "pip")))
    return stage_plan(
        plan,  # type: ignore[arg-type]
        stage,
        downloader,
        log=lambda _m: None,
        env=env,
        probe=lambda _url: None if reachable else "refused (test)",
    )


def test_a_same_named_same_version_package_on_the_default_index_is_never_taken(
    tmp_path: Path, indexes: SimpleNamespace
) -> None:
    # No hash in the lock (trust on first use): only the source decides which file comes.
    pkg = PlannedPackage(NAME, VERSION, indexes.vendor.url.rstrip("/"), ())
    result = _stage(tmp_path, pkg, indexes.env, reachable=True)
    assert result.observed_unverified[NAME] == indexes.vendor_sha
    (argv,) = result.commands
    assert "--extra-index-url" not in argv
    assert argv[argv.index("--index-url") + 1] == pkg.index
    assert indexes.default.requests == 0  # the default index was not even asked


def test_the_vendor_only_environment_drops_every_other_source() -> None:
    env = {"PIP_INDEX_URL": "a", "PIP_EXTRA_INDEX_URL": "b", "PIP_FIND_LINKS": "c", "PIP_CERT": "d"}
    vendor = commandline.download_env(env, vendor_only=True)
    assert vendor == {"PIP_CERT": "d", "PIP_CONFIG_FILE": commandline.os.devnull}
    assert commandline.download_env(env, vendor_only=False) == env


def test_an_unreachable_vendor_falls_back_only_for_a_hashed_file(
    tmp_path: Path, indexes: SimpleNamespace
) -> None:
    # The vendor index is down and the lock pins the vendor's hash: the default index's
    # same-named file is downloaded and refused for its hash, nothing is staged.
    pkg = PlannedPackage(NAME, VERSION, "https://vendor.invalid/simple", (indexes.vendor_sha,))
    with pytest.raises(InstallError, match="hash"):
        _stage(tmp_path, pkg, indexes.env, reachable=False)
    assert not list((tmp_path / "stage").glob("*.whl"))
    # Without a hash it is not attempted at all.
    unhashed = PlannedPackage(NAME, VERSION, "https://vendor.invalid/simple", ())
    with pytest.raises(InstallError, match="unreachable"):
        _stage(tmp_path / "b", unhashed, indexes.env, reachable=False)
