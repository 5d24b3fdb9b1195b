"""Forcing one implementation per op: by API (`force`, `set_impl`) and by environment.

Precedence: the API (innermost `force` block, then `set_impl`) over ``GRETA_IMPL_<OP>``
over ``GRETA_IMPL="op=impl,op=impl"``. A value may be an implementation name
("sdpa-flash") or a kind ("greta", "vendor", "reference": the first available of that kind).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping

from greta_core.compute.registry import get, valid_choices
from greta_core.errors import GretaConfigError

ENV_ALL = "GRETA_IMPL"
ENV_PREFIX = "GRETA_IMPL_"

# Process-wide (not per-thread): dispatch happens while tracing/capturing, usually on one
# thread, and a module-level dict stays readable by torch.compile's tracer.
_stack: dict[str, list[str]] = {}  # `force` blocks, innermost last
_set: dict[str, str] = {}  # `set_impl`


def env_name(op: str) -> str:
    return ENV_PREFIX + op.upper()


def parse_pairs(text: str, source: str = ENV_ALL) -> dict[str, str]:
    """ "matmul=vendor, attention=greta" -> {"matmul": "vendor", "attention": "greta"}."""
    out: dict[str, str] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        op, sep, impl = part.partition("=")
        if not sep or not op.strip() or not impl.strip():
            raise GretaConfigError(
                f"{source}: cannot read {part!r}; expected OP=IMPL pairs separated by commas, "
                f"e.g. {ENV_ALL}=matmul=vendor,attention=reference"
            )
        out[op.strip().lower()] = impl.strip().lower()
    return out


def check_choice(op: str, impl: str, source: str) -> str:
    spec = get(op)
    choices = valid_choices(spec)
    if impl not in choices:
        raise GretaConfigError(
            f"{source}: {op} has no implementation {impl!r}; choose one of: {', '.join(choices)}"
        )
    return impl


def env_choice(op: str, environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(impl, source) forced for `op` by the environment, or None."""
    environ = os.environ if environ is None else environ
    name = env_name(op)
    value = environ.get(name, "").strip().lower()
    if value:
        return check_choice(op, value, name), name
    pairs = parse_pairs(environ.get(ENV_ALL, ""))
    for key in pairs:
        get(key)  # an unknown op name in GRETA_IMPL is an error, not ignored
    if op in pairs:
        return check_choice(op, pairs[op], ENV_ALL), ENV_ALL
    return None


def forced(op: str, environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(impl, source) the user forced for `op` (API first, then environment), or None."""
    stack = _stack.get(op)
    if stack:
        return stack[-1], "greta_core.compute.force"
    if op in _set:
        return _set[op], "greta_core.compute.set_impl"
    return env_choice(op, environ)


def set_impl(op: str, impl: str | None) -> None:
    """Force `impl` for `op` until changed; None clears the API setting."""
    if impl is None:
        get(op)
        _set.pop(op, None)
        return
    _set[op] = check_choice(op, impl.lower(), "greta_core.compute.set_impl")


@contextlib.contextmanager
def force(op: str, impl: str) -> Iterator[None]:
    """``with force("matmul", "vendor"): ...`` runs matmul only with a vendor library."""
    choice = check_choice(op, impl.lower(), "greta_core.compute.force")
    stack = _stack.setdefault(op, [])
    stack.append(choice)
    try:
        yield
    finally:
        stack.pop()
        if not stack:
            _stack.pop(op, None)
