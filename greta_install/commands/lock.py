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

    if args.check:
        problems = lockgen.stale_locks(matrix, out_dir, filled=filled)
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
    return 1 if failed else 0


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
