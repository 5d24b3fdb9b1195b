#!/usr/bin/env python3
"""Carry a locked CUDA row's wheels to the lent GPU machine and install them there.

The device machine reaches no package index and takes at most 64 MiB per call, but a warm
machine keeps its files between calls. So, here:

    .venv/bin/python scripts/gpu_stack.py prepare --out .stack        # download, verify, split
    .venv/bin/python scripts/gpu_stack.py calls --out .stack          # the device calls, in order

``prepare`` reads the pins from the lock file (``lock/targets/cuda-py312.txt`` by default;
no version is written here), downloads each wheel with ``pip download --no-deps``, checks
its sha256 against the lock's hashes, and splits it into parts of at most 50 MB
(``<wheel>.partNN``) beside a manifest (``stack.json``). Packages the lock does not pin
(``--extra torchvision==X``: torch's companion the image's transformers imports) are
recorded as such, with the sha256 pip saw.

There, one call per part (each carries one part and the manifest; the command is plain
shell, ``mkdir -p /tmp/stack && cp .stack/* /tmp/stack/``, sent in quick succession: an
idle machine goes back after about 30 s), then:

    python3 scripts/gpu_stack.py install --stack /tmp/stack

joins the parts, checks each wheel's sha256 against the manifest (refusing the whole set on
any mismatch or missing part, before anything is installed), installs them without
dependencies into the interpreter's environment and writes ``/tmp/stack/installed.json``
(the versions now importable), which ``scripts/gpu_suite.sh`` copies into its result header.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

PART_BYTES = 50 * 1000 * 1000  # < 64 MiB per call, with the repository beside it
# What one call may carry besides the repository (~6 MB): small parts share a call.
CALL_BYTES = 58 * 1000 * 1000
MANIFEST = "stack.json"
# What the GPU suite needs from the locked CUDA row beyond the image: the frameworks, the
# Triton they run on, NCCL (the image's 2.28.9 lacks ncclCommResume, which torch 2.14
# needs at import) and cuDNN (torch 2.14's SDPA fails on the image's older cuDNN with
# CUDNN_STATUS_BAD_PARAM). `install` lists every other pin the machine holds at another
# version (installed.json: differs_from_lock), so a result says exactly what it ran on.
DEFAULT_PACKAGES = (
    "torch",
    "triton",
    "jax",
    "jaxlib",
    "jax-cuda13-plugin",
    "jax-cuda13-pjrt",
    "jax-triton",
    "nvidia-nccl-cu13",
    "nvidia-cudnn-cu13",
    # torch 2.15.0 (CUDA 13.2) on the image's CUDA 13.0 libraries: libtorch_nvshmem needs
    # nvshmem 3.7's symbols (ImportError: nvshmem_selected_device_transport); the CUDA
    # runtime, cuBLAS, NVRTC, nvJitLink and cuSPARSELt go at the lock's versions too.
    "nvidia-nvshmem-cu13",
    "nvidia-cublas",
    "nvidia-cuda-runtime",
    "nvidia-cuda-nvrtc",
    "nvidia-nvjitlink",
    "nvidia-cusparselt-cu13",
    "cuda-toolkit",
    "cuda-bindings",
    # ptxas for XLA: jax 0.12 assembles Triton 3.9's PTX 9.4, which the image's CUDA 13.0
    # ptxas refuses ("Unsupported .version 9.4"): greta smoke's greta-jax failed without it.
    "nvidia-cuda-nvcc",
)
# Pins the machine's image may already hold at the lock's version (the lent H100's image has
# jax 0.11.2 with its CUDA 13 plugin, as the lock does): `--expect` them instead of sending
# them, and `install` checks the installed versions against the lock before installing.
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_18_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def locked_pins(lock_path: Path, names: list[str]) -> dict[str, tuple[str, tuple[str, ...]]]:
    """name -> (version, sha256 hex digests) for `names`, read from the lock file."""
    from packaging.utils import canonicalize_name

    from greta_install.locks.lockfile import parse_lock

    lock = parse_lock(lock_path.read_text(), origin=str(lock_path))
    by_name = {p.name: p for p in lock.for_python(lock.python).packages}
    pins = {}
    for name in names:
        pkg = by_name.get(canonicalize_name(name))
        if pkg is None:
            raise SystemExit(f"gpu_stack: {lock_path} pins no {name!r}")
        pins[pkg.name] = (pkg.version, tuple(h.removeprefix("sha256:") for h in pkg.hashes))
    return pins


def _download(requirement: str, python: str, dest: Path) -> Path:
    before = set(dest.iterdir())
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
         "--python-version", python, "--implementation", "cp", *platforms, "-d", str(dest),
         requirement],
        check=True,
    )  # fmt: skip
    new = sorted(set(dest.iterdir()) - before) or sorted(
        p
        for p in dest.iterdir()
        if p.name.lower().startswith(requirement.split("==")[0].replace("-", "_").lower())
    )
    if not new:
        raise SystemExit(f"gpu_stack: pip downloaded nothing for {requirement}")
    return new[-1]


def split(wheel: Path, out: Path, part_bytes: int = PART_BYTES) -> list[str]:
    """Write `wheel` as numbered parts of at most `part_bytes` into `out`; their names."""
    names = []
    with wheel.open("rb") as f:
        for index in range(10_000):
            data = f.read(part_bytes)
            if not data:
                break
            name = f"{wheel.name}.part{index:02d}"
            (out / name).write_bytes(data)
            names.append(name)
    return names


def prepare(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.part*"):
        old.unlink()
    lock_path = Path(args.lock)
    python = args.python or _lock_python(lock_path)
    expected = locked_pins(lock_path, list(args.expect))
    pins = locked_pins(lock_path, [p for p in args.packages if p not in args.expect])
    cache = Path(args.cache or tempfile.mkdtemp(prefix="greta-stack-"))
    cache.mkdir(parents=True, exist_ok=True)
    wheels = []
    requested = [(n, v, h, True) for n, (v, h) in pins.items()]
    requested += [(*e.split("==", 1), (), False) for e in args.extra]
    for name, version, hashes, in_lock in requested:
        wheel = _cached(cache, name, version) or _download(f"{name}=={version}", python, cache)
        digest = _sha256(wheel)
        if in_lock and digest not in hashes:
            raise SystemExit(
                f"gpu_stack: {wheel.name} has sha256 {digest}, not one of the lock's for "
                f"{name}=={version}: refusing it"
            )
        parts = split(wheel, out)
        wheels.append({
            "name": name, "version": version, "file": wheel.name, "sha256": digest,
            "bytes": wheel.stat().st_size, "in_lock": in_lock, "parts": parts,
        })  # fmt: skip
        print(f"{name}=={version}: {wheel.stat().st_size / 1e6:.0f} MB, {len(parts)} part(s), "
              f"sha256 {'matches the lock' if in_lock else 'recorded (not in the lock)'}")  # fmt: skip
    manifest = {
        "lock": lock_path.as_posix(),
        "lock_input": _lock_meta(lock_path).get("input", ""),
        "python": python,
        "wheels": wheels,
        "expected": {n: v for n, (v, _) in expected.items()},
        "lock_pins": _all_pins(lock_path),
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(len(w["parts"]) for w in wheels)
    print(f"{total} parts in {out}; `gpu_stack.py calls --out {out}` lists the device calls")


def _all_pins(lock_path: Path) -> dict[str, str]:
    from greta_install.locks.lockfile import parse_lock

    lock = parse_lock(lock_path.read_text(), origin=str(lock_path))
    return {p.name: p.version for p in lock.for_python(lock.python).packages}


def _cached(cache: Path, name: str, version: str) -> Path | None:
    stem = f"{name.replace('-', '_')}-{version}-".lower()
    found = sorted(p for p in cache.glob("*.whl") if p.name.lower().startswith(stem))
    return found[-1] if found else None


def _lock_meta(lock_path: Path) -> dict[str, str]:
    meta = {}
    for line in lock_path.read_text().splitlines():
        if line.startswith("# greta-") and ":" in line:
            key, _, value = line[len("# greta-") :].partition(":")
            meta[key.strip()] = value.strip()
    return meta


def _lock_python(lock_path: Path) -> str:
    return _lock_meta(lock_path).get("python", "3.12")


def pack_calls(sizes: dict[str, int], budget: int = CALL_BYTES) -> list[list[str]]:
    """Parts grouped into as few calls as fit `budget` bytes each (first-fit, largest
    first); full-size parts travel alone."""
    groups: list[list[str]] = []
    room: list[int] = []
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        for i, left in enumerate(room):
            if sizes[name] <= left:
                groups[i].append(name)
                room[i] -= sizes[name]
                break
        else:
            groups.append([name])
            room.append(budget - sizes[name])
    return groups


def calls(args: argparse.Namespace) -> None:
    """The device calls that carry the parts, one per line as JSON (carry, command)."""
    out = Path(args.out)
    manifest = json.loads((out / MANIFEST).read_text())
    rel = out.as_posix()
    sizes = {
        part: (out / part).stat().st_size for wheel in manifest["wheels"] for part in wheel["parts"]
    }
    for group in pack_calls(sizes):
        print(json.dumps({
            "carry": [f"{rel}/{MANIFEST}", *(f"{rel}/{part}" for part in group)],
            "command": f"mkdir -p /tmp/stack && cp {rel}/* /tmp/stack/ && ls /tmp/stack | wc -l",
        }))  # fmt: skip


def assemble(stack: Path) -> list[Path]:
    """Join every wheel of the manifest in `stack` and verify it; the wheel paths. Exits
    with a one-line error, before anything is installed, on a missing part or bad digest."""
    manifest = json.loads((stack / MANIFEST).read_text())
    joined = []
    problems = []
    for wheel in manifest["wheels"]:
        missing = [p for p in wheel["parts"] if not (stack / p).is_file()]
        if missing:
            problems.append(f"{wheel['file']}: {len(missing)} part(s) missing ({missing[0]} ...)")
            continue
        target = stack / wheel["file"]
        with target.open("wb") as f:
            for part in wheel["parts"]:
                with (stack / part).open("rb") as src:
                    shutil.copyfileobj(src, f)
        digest = _sha256(target)
        if digest != wheel["sha256"]:
            problems.append(f"{wheel['file']}: sha256 {digest}, manifest says {wheel['sha256']}")
            continue
        joined.append(target)
    if problems:
        raise SystemExit("gpu_stack: not installing: " + "; ".join(problems))
    return joined


def check_expected(expected: dict[str, str]) -> dict[str, str]:
    """The installed version of each expected pin; exits when one differs from the lock."""
    import importlib.metadata as md

    seen, wrong = {}, []
    for name, version in expected.items():
        try:
            seen[name] = md.version(name)
        except md.PackageNotFoundError:
            seen[name] = "not installed"
        if seen[name] != version:
            wrong.append(f"{name} {seen[name]} (the lock pins {version})")
    if wrong:
        raise SystemExit("gpu_stack: not installing: the machine has " + ", ".join(wrong))
    return seen


def differs(pins: dict[str, str]) -> dict[str, list[str]]:
    """{name: [installed, locked]} for each pin the environment holds at another version
    (or lacks): the part of the stack that is the machine's, not the lock's."""
    import importlib.metadata as md

    out = {}
    for name, version in sorted(pins.items()):
        try:
            have = md.version(name)
        except md.PackageNotFoundError:
            have = "not installed"
        if have.split("+")[0] != version.split("+")[0]:
            out[name] = [have, version]
    return out


# torch's companions are compiled against one torch build (its C++ ABI, its CUDA): the
# image's copy breaks under another torch even where it declares no torch requirement
# (the image's torchaudio 2.11 declares none; under torch 2.15 transformers then failed to
# import: "PyTorch and TorchAudio were compiled with different CUDA versions").
TORCH_COMPANIONS = frozenset({"torchaudio", "torchvision"})


def built_for_another_torch(
    dists: list[tuple[str, list[str]]], torch_version: str, lock_pins: dict[str, str]
) -> dict[str, str]:
    """{name: why} for each (name, Requires-Dist lines) the lock does not pin that needs
    another torch: a torch requirement `torch_version` does not meet, or a companion of
    torch's (TORCH_COMPANIONS) whatever it declares."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version

    torch = Version(torch_version)
    out: dict[str, str] = {}
    for name, requires in dists:
        key = canonicalize_name(name)
        if key in lock_pins or key == "torch":
            continue
        for line in requires:
            req = Requirement(line)
            applies = req.marker is None or req.marker.evaluate({"extra": ""})
            met = req.specifier.contains(torch, prereleases=True)
            if canonicalize_name(req.name) == "torch" and applies and req.specifier and not met:
                out[name] = str(req)
        if key in TORCH_COMPANIONS and name not in out:
            out[name] = f"compiled against one torch build; the lock pins no {key}"
    return out


def pinned_to_another_torch(lock_pins: dict[str, str]) -> dict[str, str]:
    """built_for_another_torch over this interpreter's distributions and torch."""
    import importlib.metadata as md

    dists = [
        (dist.metadata["Name"], list(dist.requires or ()))
        for dist in md.distributions()
        if dist.metadata["Name"]
    ]
    return built_for_another_torch(dists, md.version("torch"), lock_pins)


def install(args: argparse.Namespace) -> None:
    stack = Path(args.stack)
    manifest = json.loads((stack / MANIFEST).read_text())
    present = check_expected(manifest.get("expected", {}))
    wheels = assemble(stack)
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
           "--no-compile", "--no-cache-dir", "--upgrade"]  # fmt: skip
    if args.target:
        cmd += ["--target", args.target]
    subprocess.run([*cmd, *map(str, wheels)], check=True)
    removed = {} if args.target else pinned_to_another_torch(manifest.get("lock_pins", {}))
    if removed:
        subprocess.run(
            [sys.executable, "-m", "pip", "uninstall", "--quiet", "-y", *removed], check=True
        )
    report = {
        "lock": manifest["lock"],
        "lock_input": manifest["lock_input"],
        "installed": {w["name"]: w["version"] for w in manifest["wheels"]},
        "sha256": {w["file"]: w["sha256"] for w in manifest["wheels"]},
        "not_in_lock": [w["name"] for w in manifest["wheels"] if not w["in_lock"]],
        "already_at_lock_version": present,
        "differs_from_lock": differs(manifest.get("lock_pins", {})),
        "removed_for_another_torch": removed,
    }
    (stack / "installed.json").write_text(json.dumps(report, indent=1) + "\n")
    for name, version in present.items():
        print(f"kept {name}=={version} (the machine's, the lock's version)")
    for w in manifest["wheels"]:
        print(f"installed {w['name']}=={w['version']} (sha256 {w['sha256'][:16]}...)")
    for name, req in removed.items():
        print(f"removed {name}: it requires {req}, not the lock's torch")
    for name, (have, want) in report["differs_from_lock"].items():
        print(f"differs from the lock: {name} {have} (locked {want})")


def not_held(report: dict[str, Any] | None, version_of: Callable[[str], str | None]) -> list[str]:
    """Why this interpreter does not hold the set an install report (``installed.json``)
    describes: no report, or a package of it missing or at another version (those the
    install itself removed as built for another torch aside). Empty: it holds it.
    `version_of(name)` is the importable version (None: not installed)."""
    from packaging.version import Version

    if report is None:
        return ["no install report: `python3 scripts/gpu_stack.py install` did not complete here"]
    wanted = {**report.get("already_at_lock_version", {}), **report["installed"]}
    for name in report.get("removed_for_another_torch", {}):
        wanted.pop(name, None)
    problems = []
    for name, want in wanted.items():
        have = version_of(name)
        if have is None:
            problems.append(f"{name} is not installed (the stack's {want})")
        elif Version(have).public != Version(want).public:
            problems.append(f"{name} {have} is importable, not the stack's {want}")
    return problems


def check(args: argparse.Namespace) -> None:
    import importlib.metadata as md

    def version_of(name: str) -> str | None:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return None

    path = Path(args.stack) / "installed.json"
    report = json.loads(path.read_text()) if path.is_file() else None
    problems = not_held(report, version_of)
    if problems:
        sys.exit(f"gpu_stack: this interpreter does not hold {path.parent}'s stack: "
                 + "; ".join(problems))  # fmt: skip
    print(f"gpu_stack: {len(report['installed'])} packages at the stack's versions")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("prepare", help="download the lock's wheels, verify, split into parts")
    p.add_argument("--lock", default="lock/targets/cuda-py312.txt")
    p.add_argument("--out", default=".stack")
    p.add_argument("--cache", help="download folder kept between runs (default: a temp dir)")
    p.add_argument("--python", help="default: the lock's greta-python")
    p.add_argument("--packages", nargs="+", default=list(DEFAULT_PACKAGES))
    p.add_argument("--expect", nargs="*", default=[], metavar="NAME",
                   help="pins the device already has at the lock's version: checked, not sent")  # fmt: skip
    p.add_argument("--extra", action="append", default=[], metavar="NAME==VERSION",
                   help="a wheel the lock does not pin (recorded as such)")  # fmt: skip
    p.set_defaults(fn=prepare)
    c = sub.add_parser("calls", help="the device calls that carry the parts")
    c.add_argument("--out", default=".stack")
    c.set_defaults(fn=calls)
    i = sub.add_parser("install", help="(on the device) join, verify, install")
    i.add_argument("--stack", default="/tmp/stack")
    i.add_argument("--target", help="install into this folder (then put it on PYTHONPATH)")
    i.set_defaults(fn=install)
    k = sub.add_parser("check", help="(on the device) is the installed stack what runs?")
    k.add_argument("--stack", default="/tmp/stack")
    k.set_defaults(fn=check)
    args = parser.parse_args(argv)
    args.fn(args)


if __name__ == "__main__":
    main()
