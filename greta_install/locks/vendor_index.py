"""Ask each vendor index once, quickly, before downloading anything from it.

pip reports an unreachable extra index as "conflicting dependencies" after retrying
every download, with the DNS error dropped. This probe answers in seconds and names the
cause; staging then fails before the first byte is fetched, or, for a file whose hash
the lock (or the trust-on-first-use record) knows, fetches it from the configured
default index or find-links instead: the hash makes the source irrelevant.
"""

from __future__ import annotations

import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable

PROBE_TIMEOUT_S = 6.0

Probe = Callable[[str], "str | None"]


def probe(url: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """None when the index answers at all; else why not, in words (DNS, refused, TLS...)."""
    parsed = urllib.parse.urlparse(url)
    host = parsed.hostname
    if not host:
        return f"{url} is not a URL"
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return f"DNS lookup of {host} failed ({exc.strerror or exc})"
    except OSError as exc:
        return f"cannot resolve {host} ({exc})"
    request = urllib.request.Request(url.rstrip("/") + "/", method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=timeout):
            return None
    except urllib.error.HTTPError:
        return None  # it answered: the index is there, the page may just not allow HEAD
    except urllib.error.URLError as exc:
        return f"{host} unreachable ({exc.reason})"
    except (OSError, ValueError) as exc:
        return f"{host} unreachable ({exc})"


def unreachable(indexes: Iterable[str], check: Probe = probe) -> dict[str, str]:
    """index URL -> why it cannot be used, for every index that does not answer."""
    out = {}
    for url in sorted(set(indexes)):
        why = check(url)
        if why is not None:
            out[url] = why
    return out
