"""Shared helpers of the install tests: tiny wheels, a misbehaving local index, venvs.

The index is a PEP 503 simple index on 127.0.0.1 in a thread, bounded in requests and
time (it stops itself); never the real package index.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import venv
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytest

REPO = Path(__file__).resolve().parent.parent
PY = f"{sys.version_info[0]}.{sys.version_info[1]}"
MAX_REQUESTS = 400
SERVER_LIFETIME_S = 300
# How often a test server's loop looks for shutdown(): each shutdown waited up to the
# default half second, once per server, in dozens of tests.
POLL_S = 0.02


# --- tiny wheels ------------------------------------------------------------------------


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(
    name: str, version: str, payload_kib: int = 1, extra: dict[str, bytes] | None = None
) -> tuple[str, bytes]:
    module = name.replace("-", "_")
    info = f"{module}-{version}.dist-info"
    files = {
        **(extra or {}),
        f"{module}/__init__.py": (
            f"VERSION = {version!r}\n# padding so a broken download stops mid-file\n"
            + "#" * (payload_kib * 1024)
            + "\n"
        ).encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: greta-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{path},{_record_hash(data)},{len(data)}\n" for path, data in files.items())
    record += f"{info}/RECORD,,\n"
    files[f"{info}/RECORD"] = record.encode()
    filename = f"{module}-{version}-py3-none-any.whl"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as zf:
        for path, data in files.items():
            zf.writestr(zipfile.ZipInfo(path, date_time=(2026, 1, 1, 0, 0, 0)), data)
    return filename, buffer.getvalue()


# --- the misbehaving index --------------------------------------------------------------


class Index:
    """files: filename -> bytes; faults: filename -> drop | 500 | tamper | slow."""

    def __init__(self, files: dict[str, bytes], faults: dict[str, str]) -> None:
        self.files = files
        self.faults = faults
        self.requests = 0
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                index.requests += 1
                if index.requests > MAX_REQUESTS:
                    self.send_error(503, "test index request budget spent")
                    return
                parts = [p for p in self.path.split("?")[0].split("/") if p]
                if len(parts) == 2 and parts[0] == "simple":
                    self._project(parts[1])
                elif len(parts) == 2 and parts[0] == "files" and parts[1] in index.files:
                    self._file(parts[1])
                else:
                    self.send_error(404)

            def _project(self, project: str) -> None:
                links = []
                for filename, data in index.files.items():
                    if filename.split("-")[0].replace("_", "-") == project:
                        served = index.served(filename, data)
                        digest = hashlib.sha256(served).hexdigest()
                        links.append(f'<a href="/files/{filename}#sha256={digest}">{filename}</a>')
                if not links:
                    self.send_error(404)
                    return
                body = ("<!DOCTYPE html><html><body>" + "".join(links) + "</body></html>").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _file(self, filename: str) -> None:
                fault = index.faults.get(filename)
                data = index.served(filename, index.files[filename])
                if fault == "500":
                    self.send_error(500, "index broke")
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if fault == "drop":
                    self.wfile.write(data[: len(data) // 3])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if fault == "slow":
                    deadline = time.monotonic() + 30
                    for i in range(0, len(data), 256):
                        if time.monotonic() > deadline:
                            return
                        self.wfile.write(data[i : i + 256])
                        self.wfile.flush()
                        time.sleep(0.2)
                    return
                self.wfile.write(data)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple/"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": POLL_S}, daemon=True
        )
        self.stopper = threading.Timer(SERVER_LIFETIME_S, self.server.shutdown)
        self.stopper.daemon = True

    def served(self, filename: str, data: bytes) -> bytes:
        if self.faults.get(filename) == "tamper":
            return data[:-1] + bytes([data[-1] ^ 0xFF])
        return data

    def __enter__(self) -> Index:
        self.thread.start()
        self.stopper.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopper.cancel()
        self.server.shutdown()
        self.server.server_close()


# --- environments -----------------------------------------------------------------------


def create_venv(path: Path) -> Path:
    venv.EnvBuilder(with_pip=True, symlinks=True).create(path)
    return path


def copy_venv(template: Path, path: Path) -> Path:
    shutil.copytree(template, path, symlinks=True)
    return path


def pip_venv(factory: pytest.TempPathFactory, path: Path) -> Path:
    """A fresh venv with pip at `path`: a copy of one template per test run.

    ensurepip costs ~8 CPU-s a venv here; a copy ~0.2. Under xdist the workers share the
    run's base folder and take a file lock, so one creates the template and the others
    copy it."""
    import fcntl

    base = factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # this run's folder, shared by its workers only
    template = base / "shared-pip-venv"
    with (base / "shared-pip-venv.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (template / "done").is_file():
            shutil.rmtree(template, ignore_errors=True)
            create_venv(template / "venv")
            (template / "done").write_text("")
    return copy_venv(template / "venv", path)


def python_of(env_dir: Path) -> str:
    return str(env_dir / "bin" / "python")


def snapshot(env_dir: Path) -> dict[str, str]:
    """Every file under the venv's lib/ with its sha256: the state a failure must keep."""
    state = {}
    for path in sorted((env_dir / "lib").rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            state[str(path.relative_to(env_dir))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return state


def make_kernel_wheel(
    arch: str,
    version: str = "0.1.0",
    extra: dict[str, bytes] | None = None,
    manifest_arch: str | None = None,
    triton_version: str | None = "3.6.0",
    triton_fingerprint: str | None = None,
) -> tuple[str, bytes]:
    """A GRETA kernel wheel as greta_core.kernel_wheels.wheelbuild lays it out (package + manifest.json)."""
    import json

    name = "greta-kernels-" + arch.replace("_", "-")
    package = name.replace("-", "_")
    manifest = {"arch": manifest_arch or arch, "package": package, "kernels": []}
    if triton_version is not None:  # what `greta build-kernels` records
        manifest["triton_version"] = triton_version
    if triton_fingerprint is not None:
        manifest["triton_fingerprint"] = triton_fingerprint
    files = {f"{package}/manifest.json": json.dumps(manifest).encode(), **(extra or {})}
    return make_wheel(name, version, extra=files)


def wait_for(
    proc: subprocess.Popen[str], marker: str, timeout: float = 120, stdout: bool = False
) -> str:
    """Read proc's stderr (or stdout: progress lines) up to the line holding marker."""
    stream = proc.stdout if stdout else proc.stderr
    assert stream is not None
    seen = ""
    deadline = time.monotonic() + timeout
    while marker not in seen and time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        seen += line
    assert marker in seen, seen
    return seen


def arm_checkpoint(
    directory: Path, checkpoint: str, wait: float, release: Path | None = None
) -> dict[str, str]:
    """The environment that arms GRETA's checkpoint hook (greta_install.install.pipeline.armed_test_hooks):
    a hooks file of this user in the test's own directory, named by GRETA_TEST_HOOKS."""
    path = directory / f"greta-test-hooks-{checkpoint}.json"
    hooks = {"greta_test_hooks": 1, "checkpoint": checkpoint, "wait": wait}
    if release is not None:
        hooks["release"] = str(release)
    path.write_text(json.dumps(hooks), encoding="utf-8")
    os.chmod(path, 0o600)
    return {"GRETA_TEST_HOOKS": str(path)}
