"""PEP 751 export of GRETA's locks (issue 28): `greta install --export-lock`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from _install_helpers import REPO
from packaging.pylock import Pylock

from greta_install.locks import pylock
from greta_install.locks.lockfile import load_lock

VENDOR = "https://download.pytorch.org/whl/cpu"


def _offered(lock, extra: dict[str, list[dict]] | None = None) -> dict:
    """What a resolver reports: per pin, one wheel per locked hash, plus `extra` files."""
    packages = []
    for pin in lock.packages:
        wheels = [
            {
                "url": f"https://files.example/{pin.name.replace('-', '_')}-{pin.version}-{i}-py3-none-any.whl",
                "hashes": {"sha256": h.removeprefix("sha256:")},
            }
            for i, h in enumerate(pin.hashes[:1])
        ]
        wheels += (extra or {}).get(pin.name, [])
        packages.append({"name": pin.name, "version": pin.version, "wheels": wheels})
    return {"lock-version": "1.0", "created-by": "uv", "packages": packages}


def test_render_keeps_only_locked_files_and_parses_as_pep751() -> None:
    lock = load_lock("cpu", "3.11").for_python("3.11")
    stranger = {"url": "https://files.example/numpy-9-py3-none-any.whl",
                "hashes": {"sha256": "f" * 64}}  # fmt: skip
    text = pylock.render(lock, _offered(lock, {"numpy": [stranger]}))
    data = tomllib.loads(text)
    parsed = Pylock.from_dict(data)  # PEP 751 validation by packaging
    by_name = {p.name: p for p in parsed.packages}
    assert set(by_name) == {p.name for p in lock.packages}
    for pin in lock.packages:
        pkg = by_name[pin.name]
        assert str(pkg.version) == pin.version
        assert pkg.wheels and all(f"sha256:{w.hashes['sha256']}" in pin.hashes for w in pkg.wheels)
        assert pkg.index == pin.index
    assert by_name["torch"].index == VENDOR
    assert data["tool"]["greta"]["env"] == lock.env
    assert "f" * 64 not in text


def test_render_refuses_a_pin_without_a_locked_file() -> None:
    lock = load_lock("cpu", "3.11").for_python("3.11")
    offered = _offered(lock)
    for pkg in offered["packages"]:
        if pkg["name"] == "torch":
            pkg["wheels"] = [{"url": "https://files.example/torch-2.13.0+cpu-cp311-cp311-x.whl",
                              "hashes": {"sha256": "0" * 64}}]  # fmt: skip
    with pytest.raises(
        pylock.PylockError, match=r"torch==2\.13\.0\+cpu: .*no file with a locked hash"
    ):
        pylock.render(lock, offered)
    offered["packages"] = [p for p in offered["packages"] if p["name"] != "numpy"]
    with pytest.raises(pylock.PylockError, match=r"numpy==.*no index offers it"):
        pylock.render(lock, offered)


def test_export_names_follow_pep751() -> None:
    assert pylock.export_name("cpu", "3.11") == "pylock.cpu-py311.toml"
    assert pylock.export_name("mi300x", "3.12", "previous") == "pylock.mi300x-py312-previous.toml"
    assert pylock.valid_name(Path(pylock.export_name("cpu", "3.11")))
    assert not pylock.valid_name(Path("cpu.toml"))


def test_export_lock_rejects_a_name_pep751_does_not_allow(tmp_path: Path) -> None:
    out = tmp_path / "cpu.toml"
    proc = subprocess.run(
        [sys.executable, "-m", "greta", "install", "--target", "cpu", "--force-target", "--export-lock", str(out)],
        capture_output=True, text=True, cwd=REPO, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "pylock.cpu-py3" in proc.stderr and not out.exists()


def test_export_against_a_local_index_is_what_uv_installs(tmp_path: Path, monkeypatch) -> None:
    """End to end on 127.0.0.1: uv finds the locked files, render keeps those with a locked
    hash, and `uv pip install --dry-run -r pylock.<name>.toml` accepts the result."""
    import hashlib

    from _install_helpers import Index, make_wheel

    from greta_install.environment.tools import find_uv
    from greta_install.locks.lockfile import Lock, LockedPackage

    uv = find_uv()
    assert uv is not None, "the test extra installs uv"
    wheels = dict([make_wheel("alpha-pkg", "1.0"), make_wheel("beta", "2.1")])
    digest = {f: "sha256:" + hashlib.sha256(d).hexdigest() for f, d in wheels.items()}
    lock = Lock(
        target="cpu",
        python=f"{sys.version_info[0]}.{sys.version_info[1]}",
        packages=tuple(
            LockedPackage(name, version, None, (digest[f],))
            for f, (name, version) in zip(
                wheels, [("alpha-pkg", "1.0"), ("beta", "2.1")], strict=True
            )
        ),
        kernel_wheel=None,
        env={"JAX_PLATFORMS": "cpu"},
    )
    with Index(wheels, {}) as index:
        monkeypatch.setenv("UV_DEFAULT_INDEX", index.url)  # never the live network
        monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
        monkeypatch.setenv("UV_NO_CONFIG", "1")
        text = pylock.render(lock, pylock.resolve(lock, uv, []))
        out = tmp_path / pylock.export_name("cpu", lock.python)
        out.write_text(text, encoding="utf-8")
        parsed = Pylock.from_dict(tomllib.loads(text))
        assert [p.name for p in parsed.packages] == ["alpha-pkg", "beta"]
        assert all(w.url and w.url.startswith(index.url.removesuffix("simple/")) for p in
                   parsed.packages for w in p.wheels)  # fmt: skip
        venv_dir = tmp_path / "venv"
        subprocess.run([uv, "venv", "-q", "-p", sys.executable, str(venv_dir)], check=True)
        proc = subprocess.run(
            [uv, "pip", "install", "--dry-run", "--python", str(venv_dir / "bin" / "python"),
             "-r", str(out)],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert "alpha-pkg==1.0" in proc.stderr + proc.stdout


# --- every lock exports (nothing is committed: a pylock names its files' URLs) -----------

FAKE_INDEX = "http://127.0.0.1:9/files"  # a closed port: no test reaches a live index


def _wheel_name(name: str, version: str, build: int = 0) -> str:
    return f"{name.replace('-', '_')}-{version}-{build}-py3-none-any.whl"


def _index_offers(lock) -> dict:
    """What a machine's index would report for every pin: a file per locked hash, and for a
    pin locked without a hash (a vendor file nobody could hash where the lock was made) the
    file the index serves, under the hash it shows."""
    packages = []
    for pin in lock.packages:
        hashes = [h.removeprefix("sha256:") for h in pin.hashes] or [f"{len(pin.name):064x}"]
        wheels = [
            {"url": f"{FAKE_INDEX}/{_wheel_name(pin.name, pin.version, i)}",
             "hashes": {"sha256": h}}
            for i, h in enumerate(hashes)
        ]  # fmt: skip
        packages.append({"name": pin.name, "version": pin.version, "wheels": wheels})
    return {"lock-version": "1.0", "created-by": "uv", "packages": packages}


def _rows() -> list[tuple[str, str, str]]:
    from greta_install.locks.lockfile import available_rows

    return available_rows()


@pytest.mark.parametrize(("target", "python", "row"), _rows())
def test_every_lock_exports_as_pep751(target: str, python: str, row: str) -> None:
    """`greta install --export-lock`'s rendering of every committed lock parses with
    packaging.pylock and says what the lock says: the same names and versions, exactly the
    locked sha256 set where the lock has one, the vendor index by URL and no other, and
    the pins locked without a hash listed as unverified."""
    lock = load_lock(target, python, row).for_python(python)
    text = pylock.render(lock, _index_offers(lock), row)
    data = tomllib.loads(text)
    parsed = Pylock.from_dict(data)
    said = {p.name: p for p in parsed.packages}
    assert set(said) == {p.name for p in lock.packages}
    for pin in lock.packages:
        pkg = said[pin.name]
        assert str(pkg.version) == pin.version and pkg.index == pin.index
        shas = {"sha256:" + w.hashes["sha256"] for w in pkg.wheels or []}
        assert shas == set(pin.hashes) if pin.hashes else len(shas) == 1
    assert data["tool"]["greta"]["unverified"] == sorted(
        p.name for p in lock.packages if not p.hashes
    )
    assert str(parsed.requires_python) == f"=={python}.*"


def test_uv_accepts_the_cpu_export_for_this_python(tmp_path: Path) -> None:
    """`uv pip install --dry-run --offline -r pylock.cpu-py<this>.toml` into a fresh venv:
    uv takes the exported cpu row as it stands (nothing fetched, nothing resolved)."""
    from greta_install.environment.tools import find_uv

    uv = find_uv()
    assert uv is not None, "the test extra installs uv"
    py = f"{sys.version_info[0]}.{sys.version_info[1]}"
    lock = load_lock("cpu", py).for_python(py)
    path = tmp_path / pylock.export_name("cpu", py)
    path.write_text(pylock.render(lock, _index_offers(lock)), encoding="utf-8")
    venv_dir = tmp_path / "venv"
    subprocess.run([uv, "venv", "-q", "-p", sys.executable, str(venv_dir)], check=True)
    proc = subprocess.run(
        [uv, "pip", "install", "--dry-run", "--offline", "--python",
         str(venv_dir / "bin" / "python"), "-r", str(path)],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "UV_NO_CONFIG": "1", "UV_CACHE_DIR": str(tmp_path / "uv-cache")},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert f"Would install {len(lock.packages)} packages" in proc.stderr + proc.stdout
    assert "+ torch==" in proc.stderr + proc.stdout


def test_no_pylock_file_is_committed() -> None:
    """Each would name its files' URLs, the default index's being a registry's: the
    project's lock files name no index but the vendors'."""
    assert sorted((REPO / "lock").rglob("pylock*.toml")) == []
