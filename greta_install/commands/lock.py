"""`greta lock`: regenerate (or check) lock/targets/*.txt and the framework-versions docs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "Generate the per-target lock files and docs from lock/matrix.toml (maintainers)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target", action="append", help="only these targets (repeatable or comma list)"
    )
    parser.add_argument(
        "--python", default=None, help="Python versions, e.g. 3.11,3.12 (default: the matrix's)"
    )
    parser.add_argument(
        "--repo", default=".", help="repository root holding lock/ and docs/ (default: .)"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="only check that the committed locks and docs match the matrix (offline); exit 1 if not",
    )
    parser.add_argument(
        "--resolve",
        action="store_true",
        help="with --check: also re-resolve every row and compare the files byte for byte (network)",
    )
    parser.add_argument(
        "--fill-hashes",
        action="store_true",
        help="(connected machine) hash every vendor file the matrix pins without a hash, from "
        "the index's sha256 or by downloading it; writes lock/hashes.toml, then regenerates",
    )
    parser.add_argument(
        "--pylock",
        action="store_true",
        help="(network) only write each lock whose pins all carry hashes as "
        "lock/targets/pylock.<target>-py<ver>.toml (PEP 751), as `greta lock` does after "
        "resolving: default-index files at their public URLs (PyPI's JSON API), vendor files "
        "from the vendor's index or the matrix's `urls`; nothing is re-resolved",
    )
    parser.add_argument(
        "--find-links",
        action="append",
        default=[],
        help="local wheel directory holding exact copies of vendor wheels (adds to pip's configured find-links)",
    )


def _split(values: list[str] | None) -> list[str]:
    out: list[str] = []
    for value in values or []:
        out += [v.strip() for v in value.split(",") if v.strip()]
    return out


def run(args: argparse.Namespace) -> int:
    from greta_install.environment.tools import find_uv, pip_config_find_links
    from greta_install.locks import docsgen, lockgen
    from greta_install.locks.lockfile import lock_filename
    from greta_install.locks.matrix import MatrixError, load_matrix

    repo = Path(args.repo)
    matrix_path = repo / "lock" / "matrix.toml"
    if not matrix_path.is_file():
        print(
            f"greta lock: {matrix_path} not found (run it in a GRETA checkout or pass --repo)",
            file=sys.stderr,
        )
        return 2
    try:
        matrix = load_matrix(matrix_path)
    except MatrixError as exc:
        print(f"greta lock: {exc}", file=sys.stderr)
        return 2
    targets = _split(args.target) or list(matrix.targets)
    pythons = _split([args.python] if args.python else None) or list(matrix.pythons)
    for name in targets:
        if name not in matrix.targets:
            print(
                f"greta lock: unknown target {name!r} (matrix has {', '.join(matrix.targets)})",
                file=sys.stderr,
            )
            return 2
    for py in pythons:
        if py not in matrix.pythons:
            print(
                f"greta lock: Python {py} is not in the matrix ({', '.join(matrix.pythons)})",
                file=sys.stderr,
            )
            return 2
    out_dir = repo / "lock" / "targets"
    hashes_path = repo / "lock" / lockgen.HASHES_FILE
    try:
        filled = lockgen.load_filled(hashes_path)
    except lockgen.LockGenError as exc:
        print(f"greta lock: {exc}", file=sys.stderr)
        return 2
    docs = {lang: repo / "docs" / lang / "framework_versions.md" for lang in docsgen.LANGUAGES}

    if args.pylock:
        return _write_pylocks(out_dir, targets, pythons, matrix, hashes_path)
    if args.check:
        problems = lockgen.stale_locks(matrix, out_dir, filled=filled)
        problems += _stale_pylocks(out_dir, matrix, targets, pythons)
        for lang, path in docs.items():
            if not path.is_file() or path.read_text(encoding="utf-8") != docsgen.render(
                matrix, lang
            ):
                problems.append(f"{path.relative_to(repo)}: out of date (run `greta lock`)")
        if args.resolve:
            uv = find_uv()
            if uv is None:
                print("greta lock: --resolve needs uv (pip install uv)", file=sys.stderr)
                return 2
            links = [*args.find_links, *pip_config_find_links()]
            for name, py, row in _rows(matrix, targets, pythons):
                path = out_dir / lock_filename(name, py, row)
                try:
                    made = lockgen.generate_row(
                        matrix, name, py, uv, links, generation=row, filled=filled
                    )
                except lockgen.LockGenError as exc:
                    problems.append(f"{name}/py{py}: {exc}")
                    continue
                if not path.is_file() or path.read_text(encoding="utf-8") != made.text:
                    problems.append(f"{path.name}: differs from a fresh resolution")
        for problem in problems:
            print(f"stale: {problem}")
        if not problems:
            print("locks and docs are up to date with lock/matrix.toml")
        return 1 if problems else 0

    uv = find_uv()
    if uv is None:
        print(
            "greta lock: needs uv to resolve and hash the default-index packages (pip install uv)",
            file=sys.stderr,
        )
        return 2
    links = [*args.find_links, *pip_config_find_links()]
    if args.fill_hashes:
        import datetime

        try:
            found = lockgen.fill_hashes(
                matrix,
                pythons,
                fetch=_fetch_text,
                download_sha256=lockgen.download_sha256,
                log=lambda m: print(m, flush=True),
            )
        except lockgen.LockGenError as exc:
            print(f"greta lock --fill-hashes: {exc}", file=sys.stderr)
            return 1
        when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        hashes_path.write_text(lockgen.format_hashes_file(found, when), encoding="utf-8")
        print(f"{hashes_path.relative_to(repo)}: {len(found)} vendor files hashed")
        filled = lockgen.load_filled(hashes_path)
    out_dir.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name, py, row in _rows(matrix, targets, pythons):
        try:
            made = lockgen.generate_row(matrix, name, py, uv, links, generation=row, filled=filled)
        except lockgen.LockGenError as exc:
            print(f"{name}/py{py} ({row}): FAILED: {exc}", file=sys.stderr)
            failed += 1
            continue
        path = out_dir / lock_filename(name, py, row)
        path.write_text(made.text, encoding="utf-8")
        note = f", unverified: {', '.join(made.unverified)}" if made.unverified else ""
        print(f"{path.relative_to(repo)}: {len(made.lock.packages)} packages{note}")
    for lang, path in docs.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(docsgen.render(matrix, lang), encoding="utf-8")
        print(f"{path.relative_to(repo)}: written")
    # Each lock also as PEP 751, from the locks just written (their files looked up).
    failed += _write_pylocks(out_dir, targets, pythons, matrix, hashes_path)
    return 1 if failed else 0


def _write_pylocks(out: Path, targets, pythons, matrix, hashes_path: Path) -> int:  # type: ignore[no-untyped-def]
    """The committed locks as PEP 751 files beside them. Default-index files get the
    public index's URLs; a vendor file needs its index's page or a URL the matrix (or
    lock/hashes.toml) records with its hash. A lock with a pin lacking either gets no
    file, and the reason is printed."""
    import json
    import urllib.request

    from greta_install.locks import lockgen, pylock
    from greta_install.locks.lockfile import LockError, lock_filename, parse_lock

    def fetch_json(name: str) -> dict:
        url = pylock.PUBLIC_JSON.format(name=name)
        with urllib.request.urlopen(url, timeout=lockgen.INDEX_TIMEOUT_S) as response:
            return json.loads(response.read().decode("utf-8"))

    recorded = [*_matrix_urls(matrix), *lockgen.load_filled_files(hashes_path)]
    json_cache: dict[str, dict] = {}
    said: set[str] = set()

    def cached(pkg: str) -> dict:
        if pkg not in json_cache:
            json_cache[pkg] = fetch_json(pkg)
        return json_cache[pkg]

    def vendor(index: str, pkg: str, version: str) -> list[pylock.KnownFile]:
        found = [f for (n, v, f) in recorded if n == pkg and v == version]
        try:
            found += lockgen.vendor_page_files(index, pkg, version, _fetch_text)
        except OSError as exc:
            if index not in said:  # the matrix's URLs stand in for its page
                said.add(index)
                print(f"{index}: unreachable ({exc.__class__.__name__})")
        return found

    failed = 0
    for name, py, row in _rows(matrix, targets, pythons):
        path = out / pylock.committed_name(name, py, row)
        try:
            txt = out / lock_filename(name, py, row)
            lock = parse_lock(txt.read_text(encoding="utf-8"), name, py, txt.name).for_python(py)
            unverified = [p.name for p in lock.packages if not p.hashes]
            if unverified:
                path.unlink(missing_ok=True)
                print(f"{path.name}: not written: no hash locked for {', '.join(unverified)}")
                continue
            files = pylock.gather_files(lock, cached, vendor)
            text = pylock.render_committed(lock, files, row)
        except (LockError, pylock.PylockError, OSError, ValueError) as exc:
            print(f"{path.name}: FAILED: {exc}", file=sys.stderr)
            failed += 1
            continue
        path.write_text(text, encoding="utf-8")
        print(f"{path.name}: {text.count('[[packages]]')} packages")
    return 1 if failed else 0


def _matrix_urls(matrix) -> list[tuple[str, str, object]]:  # type: ignore[no-untyped-def]
    """(name, version, KnownFile) of every URL the matrix records with a hash."""
    from greta_install.locks import pylock

    out: list[tuple[str, str, object]] = []
    for row in matrix.rows():
        for pin in row.pins:
            out += [(pin.name, pin.version, f) for f in pylock.url_files(pin.urls)]
    return out


def _stale_pylocks(folder: Path, matrix, targets: list[str], pythons: list[str]) -> list[str]:  # type: ignore[no-untyped-def]
    """The committed pylock files checked against the committed locks (offline)."""
    from greta_install.locks import pylock
    from greta_install.locks.lockfile import lock_filename, parse_lock

    def load(target: str, python: str, row: str):  # type: ignore[no-untyped-def]
        path = folder / lock_filename(target, python, row)
        return parse_lock(path.read_text(encoding="utf-8"), target, python, path.name)

    rows = [r for r in _rows(matrix, targets, pythons) if (folder / lock_filename(*r)).is_file()]
    return pylock.stale_committed(folder, rows, load)


def _rows(matrix, targets: list[str], pythons: list[str]):  # type: ignore[no-untyped-def]
    """(target, python, row) of every lock file to write, in a stable order."""
    for name in targets:
        for row in matrix.generations(name):
            for py in pythons:
                if row in matrix.generations(name, py):
                    yield name, py, row


def _fetch_text(url: str) -> str:
    import urllib.request

    from greta_install.locks.lockgen import INDEX_TIMEOUT_S

    with urllib.request.urlopen(url, timeout=INDEX_TIMEOUT_S) as response:
        return response.read().decode("utf-8", errors="replace")
