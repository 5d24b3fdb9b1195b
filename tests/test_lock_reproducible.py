"""`greta lock` is reproducible: the same matrix gives the same lock, whatever the index
publishes after the matrix's `exclude_newer` instant.

The index is ours: a PEP 691 (JSON) simple index on 127.0.0.1 that serves upload times
(PEP 700), bounded in requests and lifetime. It first serves what existed when the lock was
made, then also versions "published tomorrow" of both a pinned package's dependency and a
transitive one; the regenerated lock must not move. This replaces comparing a live public
index with yesterday's committed lock (still available as the `network` test in
test_lockfile.py, deselected in CI).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import http.server
import io
import json
import threading
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from _install_helpers import POLL_S

from greta_install.environment.tools import find_uv
from greta_install.locks import lockgen
from greta_install.locks.lockfile import parse_lock
from greta_install.locks.matrix import Matrix, Pin, TargetSpec

CUTOFF = "2026-11-22T00:00:00Z"
BEFORE = "2026-10-01T12:00:00Z"
AFTER = "2026-11-23T08:00:00Z"  # "tomorrow", from the lock's point of view
MAX_REQUESTS = 300
LIFETIME_S = 120


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def wheel(name: str, version: str, requires: tuple[str, ...] = ()) -> tuple[str, bytes]:
    module = name.replace("-", "_")
    info = f"{module}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = {
        f"{module}/__init__.py": f"VERSION = {version!r}\n".encode(),
        f"{info}/METADATA": meta.encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: greta-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{p},sha256={_b64(d)},{len(d)}\n" for p, d in files.items())
    files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for path, data in files.items():
            zf.writestr(zipfile.ZipInfo(path, date_time=(2026, 1, 1, 0, 0, 0)), data)
    return f"{module}-{version}-py3-none-any.whl", buffer.getvalue()


@dataclass
class JsonIndex:
    """project -> [(filename, bytes, upload time)], served as PEP 691 JSON."""

    projects: dict[str, list[tuple[str, bytes, str]]] = field(default_factory=dict)
    requests: int = 0

    def add(self, name: str, version: str, uploaded: str, requires: tuple[str, ...] = ()) -> None:
        filename, data = wheel(name, version, requires)
        self.projects.setdefault(name, []).append((filename, data, uploaded))

    def serve(self) -> Iterator[str]:
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, body: bytes, ctype: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_HEAD(self) -> None:
                # No Accept-Ranges: uv then downloads whole wheels for their metadata.
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self) -> None:
                index.requests += 1
                if index.requests > MAX_REQUESTS:
                    self.send_error(503, "request budget spent")
                    return
                parts = [p for p in self.path.split("?")[0].split("/") if p]
                if len(parts) == 2 and parts[0] == "simple" and parts[1] in index.projects:
                    files = [
                        {
                            "filename": fn,
                            "url": f"/files/{fn}",
                            "hashes": {"sha256": hashlib.sha256(data).hexdigest()},
                            "upload-time": up,
                        }
                        for fn, data, up in index.projects[parts[1]]
                    ]
                    doc = {"meta": {"api-version": "1.1"}, "name": parts[1], "files": files}
                    self._send(json.dumps(doc).encode(), "application/vnd.pypi.simple.v1+json")
                    return
                if len(parts) == 2 and parts[0] == "files":
                    for files in index.projects.values():
                        for fn, data, _ in files:
                            if fn == parts[1]:
                                self._send(data, "application/octet-stream")
                                return
                self.send_error(404)

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        thread = threading.Thread(target=server.serve_forever, args=(POLL_S,), daemon=True)
        thread.start()
        timer = threading.Timer(LIFETIME_S, server.shutdown)
        timer.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}/simple"
        finally:
            timer.cancel()
            server.shutdown()
            server.server_close()


def matrix_with(pin_version: str) -> Matrix:
    pin = Pin(
        name="alpha-pkg", version=pin_version, role="torch", pythons=("3.12",), index=None,
        extras=(), requires=(), provides=(), source="test", uncertain=None,
    )  # fmt: skip
    spec = TargetSpec(
        name="cpu", hardware="test", default_arch=None, archs=(), torch_archs=(),
        kernel_wheel=False, env={}, env_why={}, system="", absent={}, pins=(pin,), same_as=None,
    )  # fmt: skip
    return Matrix(
        exclude_newer=CUTOFF, platform="x86_64-manylinux_2_28", pythons=("3.12",),
        targets={"cpu": spec}, raw={"test": pin_version},
    )  # fmt: skip


@pytest.fixture
def uv() -> str:
    found = find_uv()
    if found is None:
        pytest.skip("uv not installed (it is in the test extra)")
    return found


def _generate(url: str, uv: str, monkeypatch: pytest.MonkeyPatch) -> lockgen.Generated:
    for var in ("UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_INDEX", "UV_FIND_LINKS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("UV_DEFAULT_INDEX", url)
    monkeypatch.setenv("UV_NO_CONFIG", "1")
    monkeypatch.setenv("UV_OFFLINE", "0")
    return lockgen.generate_row(matrix_with("1.0"), "cpu", "3.12", uv, version="0.1.0")


def test_lock_ignores_what_the_index_published_after_exclude_newer(
    uv: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    index = JsonIndex()
    index.add("alpha-pkg", "1.0", BEFORE, ("beta-pkg>=2",))
    index.add("beta-pkg", "2.0", BEFORE, ("gamma-pkg",))
    index.add("gamma-pkg", "3.0", BEFORE)
    serving = index.serve()
    url = next(serving)
    try:
        first = _generate(url, uv, monkeypatch)
        versions = {p.name: p.version for p in first.lock.packages}
        assert versions == {"alpha-pkg": "1.0", "beta-pkg": "2.0", "gamma-pkg": "3.0"}
        digest = hashlib.sha256(index.projects["beta-pkg"][0][1]).hexdigest()
        [beta] = [p for p in first.lock.packages if p.name == "beta-pkg"]
        assert beta.hashes == (f"sha256:{digest}",)
        # The next day the index has moved on: a direct and a transitive dependency.
        index.add("beta-pkg", "2.1", AFTER, ("gamma-pkg",))
        index.add("gamma-pkg", "3.1", AFTER)
        second = _generate(url, uv, monkeypatch)
    finally:
        serving.close()
    assert second.text == first.text
    # ... and the text is a valid lock for its row, hashes on every pin.
    parsed = parse_lock(second.text, "cpu", "3.12", "regenerated")
    assert all(p.verified for p in parsed.packages)


def test_lock_moves_only_when_the_matrix_does(uv: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Control for the test above: with a later cutoff, the new versions are picked, so
    the local index really offers them and the exclusion is what kept them out."""
    index = JsonIndex()
    index.add("alpha-pkg", "1.0", BEFORE, ("beta-pkg>=2",))
    index.add("beta-pkg", "2.0", BEFORE)
    index.add("beta-pkg", "2.1", AFTER)
    serving = index.serve()
    url = next(serving)
    try:
        for var in ("UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_INDEX", "UV_FIND_LINKS"):
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setenv("UV_DEFAULT_INDEX", url)
        monkeypatch.setenv("UV_NO_CONFIG", "1")
        later = dataclasses.replace(matrix_with("1.0"), exclude_newer="2026-12-01T00:00:00Z")
        made = lockgen.generate_row(later, "cpu", "3.12", uv, version="0.1.0")
    finally:
        serving.close()
    assert {p.name: p.version for p in made.lock.packages}["beta-pkg"] == "2.1"
