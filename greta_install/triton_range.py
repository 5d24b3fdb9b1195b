"""The Triton versions GRETA's fast launch paths are written for: the one place that says so.

Stdlib only (the doctor reads it without importing Triton). The eager hot path
(``greta_core.ops._direct``) hands Triton's C launcher what Triton's own ``CudaLauncher``
would; how it does so is an explicit adapter per Triton minor version, chosen here by
version number, never by reading Triton's source. Every version in the range is tested:
``tests/test_triton_range.py`` runs the installed Triton's real ``CudaLauncher.__call__``
and checks the adapter hands its C launcher the same arguments. Outside the range GRETA
launches through Triton's own path, records ``fast-launch-off`` in ``greta_core.observe``
and ``greta doctor`` says "fast launch off: Triton X not supported".
"""

from __future__ import annotations

import re

# Oldest and newest supported Triton (major, minor), inclusive. The lock pins 3.6 (previous
# rows), 3.8 (current rows) and 3.9 (the next matrix).
OLDEST: tuple[int, int] = (3, 6)
NEWEST: tuple[int, int] = (3, 9)

# How Triton's CudaLauncher.__call__ hands its C ``launch`` the arguments:
#   "flat"   (3.6):      launch(gx, gy, gz, stream, function, cooperative, pdl,
#                               global_scratch, profile_scratch, packed_metadata,
#                               launch_metadata, enter_hook, exit_hook, *kernel_args)
#   "packed" (3.7-3.9):  launch(gx, gy, gz, stream, function, cooperative, pdl,
#                               packed_metadata, launch_metadata, enter_hook, exit_hook,
#                               global_scratch, profile_scratch, arg_annotations,
#                               kernel_signature, kernel_args)
# JITFunction.run calls ``kernel.run(gx, gy, gz, stream, function, packed_metadata,
# launch_metadata, enter_hook, exit_hook, *args)`` in every version of the range.
LAUNCH_CONVENTIONS: dict[tuple[int, int], str] = {
    (3, 6): "flat",
    (3, 7): "packed",
    (3, 8): "packed",
    (3, 9): "packed",
}
assert min(LAUNCH_CONVENTIONS) == OLDEST and max(LAUNCH_CONVENTIONS) == NEWEST


# Triton 3.9 removed block pointers (``tl.make_block_ptr``/``tl.advance``) in favour of tensor
# descriptors: a kernel that uses one fails to compile there ("Block pointers have been
# removed in favor of the tensor descriptor API").
LAST_WITH_BLOCK_POINTERS: tuple[int, int] = (3, 8)


def parse(version: str | None) -> tuple[int, int] | None:
    """(major, minor) of a Triton version string ("3.8.0", "3.6.0+rocm7.2"), or None."""
    match = re.match(r"^\s*(\d+)\.(\d+)", version or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def has_block_pointers(version: str | None) -> bool:
    """Whether Triton `version` still compiles ``tl.make_block_ptr``."""
    key = parse(version)
    return key is not None and key <= LAST_WITH_BLOCK_POINTERS


def supported_text() -> str:
    return f"{OLDEST[0]}.{OLDEST[1]}-{NEWEST[0]}.{NEWEST[1]}"


def launch_convention(version: str | None) -> str | None:
    """The launch adapter for Triton `version`, or None outside the supported range."""
    key = parse(version)
    return LAUNCH_CONVENTIONS.get(key) if key is not None else None


def per_signature_launcher(version: str | None) -> bool:
    """True where Triton builds a C launcher module per kernel signature at a first launch
    (3.6: ``CudaLauncher``/``HIPLauncher`` compile generated source); from 3.7 every kernel
    goes through one generic launcher in the driver helpers (``utils.launch``), built once."""
    return launch_convention(version) == "flat"


def fast_launch_off_reason(version: str | None) -> str | None:
    """None when the fast launch path supports Triton `version`; else the one-line reason."""
    if launch_convention(version) is not None:
        return None
    return f"fast launch off: Triton {version or 'unknown'} not supported (GRETA supports {supported_text()})"
