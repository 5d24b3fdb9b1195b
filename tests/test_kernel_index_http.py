"""A kernel wheel from a web index follows the folder's rule, and every wheel left out is
left out with its reason (issue 30 items 5 and 9), against a fake index on 127.0.0.1.

Found by the campaign: a wheel with a build tag that SHA256SUMS does not list was chosen;
a plain-http index, a `file://` href and a page over 16 MiB dropped the wheel with no
reason given."""

from __future__ import annotations

import hashlib
import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
from _install_helpers import POLL_S, REPO, make_kernel_wheel

from greta_install import boundedio
from greta_install.install.installer import find_kernel_wheel

ARCH = "gfx942"
REQ = "greta-kernels-gfx942==0.1.0"
NAME, DATA = make_kernel_wheel(ARCH)
TAGGED = NAME.replace("-0.1.0-", "-0.1.0-1zz-")
TAGGED_DATA = DATA + b"\0"  # another file: another hash
SHA = hashlib.sha256(DATA).hexdigest()
TAGGED_SHA = hashlib.sha256(TAGGED_DATA).hexdigest()
PAGE = "/greta-kernels-gfx942/"


@contextmanager
def serve(routes: dict[str, bytes], stream: frozenset[str] = frozenset()) -> Iterator[str]:
    """An index at http://127.0.0.1:PORT serving `routes` (path -> body); paths in `stream`
    are sent without Content-Length (the client must count what it reads)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            body = routes.get(self.path.split("?")[0])
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            if self.path in stream:
                self.send_header("Connection", "close")
                self.end_headers()
                try:
                    for i in range(0, len(body), 1 << 20):
                        self.wfile.write(body[i : i + (1 << 20)])
                except OSError:
                    pass  # the client stopped reading at its limit
                return
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            with suppress(OSError):
                self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(POLL_S,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def page(*links: str) -> bytes:
    return ("<!DOCTYPE html><html><body>" + "".join(links) + "</body></html>").encode()


def link(filename: str, sha: str | None = None, prefix: str = "/files/") -> str:
    return f'<a href="{prefix}{filename}{f"#sha256={sha}" if sha else ""}">{filename}</a>'


def test_sha256sums_decides_which_build_is_chosen() -> None:
    sums = f"{SHA}  {NAME}\n".encode()
    routes = {PAGE: page(link(TAGGED, TAGGED_SHA), link(NAME, SHA)), "/SHA256SUMS": sums}
    with serve(routes) as url:
        found = find_kernel_wheel(url, REQ, allow_http=True)
        assert found.location == f"{url}/files/{NAME}" and found.sha256 == SHA
        routes[PAGE] = page(link(TAGGED, TAGGED_SHA))  # only the unlisted build is offered
        refused = find_kernel_wheel(url, REQ, allow_http=True)
        assert refused.location is None
        assert refused.problem == f"{TAGGED} on {url} is not listed in its SHA256SUMS"


def test_without_sha256sums_a_build_tag_is_not_chosen() -> None:
    routes = {PAGE: page(link(TAGGED, TAGGED_SHA))}
    with serve(routes) as url:
        refused = find_kernel_wheel(url, REQ, allow_http=True)
        assert refused.location is None
        assert f"{TAGGED} on {url} has a build tag (1zz) and no SHA256SUMS lists it" in str(
            refused.problem
        )
        routes[PAGE] = page(link(TAGGED, TAGGED_SHA), link(NAME, SHA))
        found = find_kernel_wheel(url, REQ, allow_http=True)
        assert found.location == f"{url}/files/{NAME}" and found.sha256 == SHA


def test_a_build_that_sha256sums_lists_is_chosen_with_its_hash() -> None:
    routes = {PAGE: page(link(TAGGED)), "/SHA256SUMS": f"{TAGGED_SHA}  {TAGGED}\n".encode()}
    with serve(routes) as url:
        found = find_kernel_wheel(url, REQ, allow_http=True)
        assert found.location == f"{url}/files/{TAGGED}" and found.sha256 == TAGGED_SHA


def test_a_page_hash_that_sha256sums_contradicts_is_dropped() -> None:
    routes = {PAGE: page(link(NAME, TAGGED_SHA)), "/SHA256SUMS": f"{SHA}  {NAME}\n".encode()}
    with serve(routes) as url:
        refused = find_kernel_wheel(url, REQ, allow_http=True)
        assert refused.location is None and f"SHA256SUMS says sha256:{SHA}" in str(refused.problem)


def test_a_plain_http_index_says_why() -> None:
    with serve({PAGE: page(link(NAME, SHA))}) as url:
        refused = find_kernel_wheel(url, REQ)
    assert refused.location is None
    assert refused.problem == (
        f"kernel index {url}: plain http is refused (use https, or pass --allow-http), "
        "so no kernel wheel is taken from it"
    )


@pytest.mark.parametrize("upper", [False, True], ids=["file", "FILE"])
def test_a_file_href_says_why(upper: bool, tmp_path: Path) -> None:
    href = tmp_path.as_uri() + "/"
    href = "FILE" + href[4:] if upper else href
    with serve({PAGE: page(link(NAME, SHA, prefix=href))}) as url:
        refused = find_kernel_wheel(url, REQ, allow_http=True)
    assert refused.location is None
    assert refused.problem is not None and refused.problem.startswith(
        f"{NAME} is linked as a local file ("
    )
    assert refused.problem.endswith("an index may link only https files; dropped")


@pytest.mark.parametrize("streamed", [False, True], ids=["content-length", "streamed"])
def test_a_page_over_the_limit_says_why(streamed: bool) -> None:
    big = page(link(NAME, SHA)) + b" " * boundedio.PAGE_MAX_BYTES
    with serve({PAGE: big}, frozenset({PAGE} if streamed else ())) as url:
        refused = find_kernel_wheel(url, REQ, allow_http=True)
    assert refused.location is None
    assert refused.problem == (
        f"kernel index page {url}{PAGE} is over the {boundedio.PAGE_MAX_BYTES}-byte limit for "
        "an index page: not read, so no kernel wheel is taken from it"
    )


def test_the_reason_reaches_the_install_plan(tmp_path: Path) -> None:
    """`greta install --dry-run` shows why the index's wheel was not taken."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRETA_")}
    with serve({PAGE: page(link(NAME, SHA, prefix=tmp_path.as_uri() + "/"))}) as url:
        proc = subprocess.run(
            [sys.executable, "-m", "greta", "install", "--dry-run", "--target", "mi300x",
             "--arch", ARCH, "--kernel-wheels", url, "--allow-http"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    assert "Traceback" not in proc.stderr
    assert f"{NAME} is linked as a local file" in proc.stdout + proc.stderr
