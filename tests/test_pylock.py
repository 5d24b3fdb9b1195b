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


# --- the committed pylock files (lock/targets/pylock.*.toml) ---------------------------

TARGETS = REPO / "lock" / "targets"


def _txt_rows() -> list[tuple[str, str, str]]:
    from greta_install.locks.lockfile import available_rows

    return available_rows()


def test_every_committed_pylock_says_what_its_lock_says() -> None:
    """Parsed by packaging.pylock: the same names, versions and sha256 sets as the .txt lock;
    every lock whose pins all carry hashes has one, a lock with a hashless pin has none."""
    made = 0
    for target, python, row in _txt_rows():
        lock = load_lock(target, python, row).for_python(python)
        path = TARGETS / pylock.committed_name(target, python, row)
        if not all(p.hashes for p in lock.packages):
            assert not path.exists(), path.name
            continue
        parsed = Pylock.from_dict(tomllib.loads(path.read_text(encoding="utf-8")))
        said = {}
        for pkg in parsed.packages:
            files = list(pkg.wheels or []) + ([pkg.sdist] if pkg.sdist else [])
            assert all(f.url and f.url.startswith("https://") for f in files), pkg.name
            said[pkg.name] = (str(pkg.version), {"sha256:" + f.hashes["sha256"] for f in files})
        assert said == {p.name: (p.version, set(p.hashes)) for p in lock.packages}, path.name
        assert str(parsed.requires_python) == f"=={python}.*"
        made += 1
    assert made == len(list(TARGETS.glob("pylock.*.toml"))) >= 6


def test_committed_pylocks_are_fresh_and_the_check_sees_each_fault(tmp_path: Path) -> None:
    from greta_install.locks.lockfile import parse_lock

    def load(target: str, python: str, row: str):
        from greta_install.locks.lockfile import lock_filename

        path = tmp_path / lock_filename(target, python, row)
        return parse_lock(path.read_text(encoding="utf-8"), target, python, path.name)

    rows = [("cpu", "3.11", "current"), ("cuda", "3.12", "previous")]
    for target, python, row in rows:
        from greta_install.locks.lockfile import lock_filename

        for name in (
            lock_filename(target, python, row),
            pylock.committed_name(target, python, row),
        ):
            if (TARGETS / name).exists():
                (tmp_path / name).write_bytes((TARGETS / name).read_bytes())
    assert pylock.stale_committed(tmp_path, rows, load) == []

    cpu = tmp_path / "pylock.cpu-py311.toml"
    good = cpu.read_text(encoding="utf-8")
    torch_hash = "6746dbcbeb526eb61330b76b41ff1b4eb848951103a892eeb080dfa2b264667b"
    cpu.write_text(good.replace(torch_hash, "0" * 64), encoding="utf-8")
    assert pylock.stale_committed(tmp_path, rows, load) == [
        f"pylock.cpu-py311.toml: torch==2.13.0+cpu: no known file for sha256:{torch_hash} "
        "(run `greta lock --pylock`)"
    ]
    cpu.write_text(good.replace('version = "4.3.1"', 'version = "4.3.2"'), encoding="utf-8")
    (problem,) = pylock.stale_committed(tmp_path, rows, load)  # packaging.pylock's own check
    assert "Version in 'filelock-4.3.1-py3-none-any.whl' is not consistent" in problem
    cpu.write_text(good.replace('requires-python = "==3.11.*"\n', ""), encoding="utf-8")
    assert pylock.stale_committed(tmp_path, rows, load) == [
        "pylock.cpu-py311.toml: differs from its lock (run `greta lock --pylock`)"
    ]
    cpu.unlink()
    assert pylock.stale_committed(tmp_path, rows, load) == [
        "pylock.cpu-py311.toml: missing (run `greta lock --pylock`)"
    ]
    cpu.write_text(good, encoding="utf-8")
    (tmp_path / "pylock.cuda-py312-previous.toml").write_text(good, encoding="utf-8")
    assert pylock.stale_committed(tmp_path, rows, load) == [
        "pylock.cuda-py312-previous.toml: its lock has unverified pins; remove it"
    ]


def test_public_files_use_the_file_hosts_digest_layout() -> None:
    blake = "537b678c8fbd372ff96375ac0bbdd20b78f20ef8ba6ca5966c49548fa5886557"
    document = {
        "releases": {
            "13.0.3": [  # the API keys a release as uploaded; the lock says 13.0.3.0
                {"filename": "cuda_toolkit-13.0.3.0-py2.py3-none-any.whl", "size": 7,
                 "url": "../../elsewhere/x.whl",
                 "digests": {"sha256": "a" * 64, "blake2b_256": blake}},
                {"filename": "no-digest.whl", "digests": {"sha256": "b" * 64}},
            ],
            "13.0.4": [{"filename": "cuda_toolkit-13.0.4-py3-none-any.whl",
                        "digests": {"sha256": "c" * 64, "blake2b_256": blake}}],
        }
    }  # fmt: skip
    assert pylock.public_files("cuda-toolkit", "13.0.3.0", document) == [
        pylock.KnownFile(
            "a" * 64,
            "cuda_toolkit-13.0.3.0-py2.py3-none-any.whl",
            "https://files.pythonhosted.org/packages/53/7b/678c8fbd372ff96375ac0bbdd20b78f20ef8"
            "ba6ca5966c49548fa5886557/cuda_toolkit-13.0.3.0-py2.py3-none-any.whl",
            7,
        )
    ]


def test_vendor_urls_in_the_matrix_are_checked() -> None:
    from greta_install.locks.matrix import MatrixError, load_matrix

    matrix = load_matrix(REPO / "lock" / "matrix.toml")
    torch = next(p for p in matrix.row("cpu", "3.11", "current").pins if p.name == "torch")
    files = pylock.url_files(torch.urls)
    assert {f.filename for f in files} == {
        f"torch-2.13.0+cpu-cp3{m}-cp3{m}-manylinux_2_28_x86_64.whl" for m in (11, 12)
    }
    text = (REPO / "lock" / "matrix.toml").read_text(encoding="utf-8")
    broken = text.replace('url_source = "The index serves', 'url_sourcex = "The index serves', 1)
    path = REPO / "lock" / "matrix.toml"
    with pytest.raises(MatrixError, match="`urls` needs `url_source`"):
        _load_text(broken, path)
    with pytest.raises(MatrixError, match="must map 'sha256:<64 hex>' to an https URL"):
        _load_text(
            text.replace('= "https://download.pytorch.org/whl/cpu/torch-', '= "http://x/torch-', 1),
            path,
        )


def _load_text(text: str, like: Path):
    import tempfile

    from greta_install.locks.matrix import load_matrix

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / like.name
        path.write_text(text, encoding="utf-8")
        return load_matrix(path)


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_uv_accepts_the_committed_pylock_for_this_python(tmp_path: Path, target: str) -> None:
    """`uv pip install --dry-run --offline -r pylock.<target>-py<this>.toml` into a fresh venv."""
    from greta_install.environment.tools import find_uv

    uv = find_uv()
    assert uv is not None, "the test extra installs uv"
    py = f"{sys.version_info[0]}.{sys.version_info[1]}"
    path = TARGETS / pylock.committed_name(target, py)
    venv_dir = tmp_path / "venv"
    subprocess.run([uv, "venv", "-q", "-p", sys.executable, str(venv_dir)], check=True)
    proc = subprocess.run(
        [uv, "pip", "install", "--dry-run", "--offline", "--python",
         str(venv_dir / "bin" / "python"), "-r", str(path)],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "UV_NO_CONFIG": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lock = load_lock(target, py).for_python(py)
    assert f"Would install {len(lock.packages)} packages" in proc.stderr + proc.stdout
    assert "+ torch==" in proc.stderr + proc.stdout


def test_regenerating_from_the_public_api_gives_the_committed_file() -> None:
    """`greta lock --pylock`'s path offline: PyPI JSON documents (rebuilt from the committed
    file, as the API lays them out) and the matrix's vendor URLs give back the same text."""
    from greta_install.locks.matrix import load_matrix

    committed = (TARGETS / "pylock.cpu-py311.toml").read_text(encoding="utf-8")
    documents: dict[str, dict] = {}
    for pkg in tomllib.loads(committed)["packages"]:
        if pkg["index"] != pylock.PUBLIC_INDEX:
            continue
        files = pkg["wheels"] + ([pkg["sdist"]] if "sdist" in pkg else [])
        entries = []
        for f in files:
            a, b, rest = f["url"].removeprefix(pylock.PUBLIC_FILES + "/").split("/")[:3]
            entries.append({"filename": f["name"], "size": f["size"], "url": "../elsewhere",
                            "digests": {"sha256": f["hashes"]["sha256"], "blake2b_256": a + b + rest}})  # fmt: skip
        documents[pkg["name"]] = {"releases": {pkg["version"]: entries, "0.0.1": []}}
    matrix = load_matrix(REPO / "lock" / "matrix.toml")
    urls = [p.urls for p in matrix.row("cpu", "3.11", "current").pins if p.urls]

    def vendor(index: str, name: str, version: str) -> list[pylock.KnownFile]:
        assert index == VENDOR and name == "torch"
        return [f for u in urls for f in pylock.url_files(u)]

    lock = load_lock("cpu", "3.11").for_python("3.11")
    files = pylock.gather_files(lock, documents.__getitem__, vendor)
    assert pylock.render_committed(lock, files) == committed
