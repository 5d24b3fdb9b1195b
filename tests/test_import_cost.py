"""`import greta_core.torch` leaves torch's compiler stack unimported (issue 28, item 1)."""

from __future__ import annotations

import json
import subprocess
import sys

from greta_core.torch._deferred_scan import _ScannedOnRead, deferred_kernel_scan

COMPILER = ("torch._dynamo", "torch._inductor")


def _modules_after(code: str) -> list[str]:
    probe = (
        f"{code}\nimport json, sys\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.startswith({COMPILER!r}))))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=600, check=True
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_import_greta_core_torch_imports_no_dynamo_or_inductor() -> None:
    assert _modules_after("import greta_core.torch") == []


def test_the_ops_are_registered_all_the_same() -> None:
    import torch

    import greta_core.torch  # noqa: F401

    for name in ("rms_norm_fwd", "add_rms_norm_fwd", "attention", "swiglu", "rope"):
        assert hasattr(torch.ops.greta, name), name


def test_the_kernel_scan_runs_once_on_first_read() -> None:
    calls: list[object] = []

    def scan(fn: object) -> list[object]:
        calls.append(fn)
        return ["k1", "k2"]

    lazy = _ScannedOnRead(scan, "the op body")
    assert calls == []
    assert list(lazy) == ["k1", "k2"] and len(lazy) == 2 and "k2" in lazy
    assert lazy == ["k1", "k2"] and lazy[0] == "k1"
    assert calls == ["the op body"]


def test_the_scan_is_put_back_after_registering() -> None:
    from torch._library import triton as library_triton

    before = library_triton.get_inner_triton_kernels
    with deferred_kernel_scan():
        assert library_triton.get_inner_triton_kernels is not before
        assert isinstance(library_triton.get_inner_triton_kernels(len), _ScannedOnRead)
    assert library_triton.get_inner_triton_kernels is before


def test_the_deferred_list_is_what_torch_compile_reads() -> None:
    """torch.compile's AOT-autograd cache key reads each op's kernels through
    get_triton_kernels_for_op: it gets the same answer as torch's eager scan would."""
    import torch._library.triton as library_triton

    from greta_core.torch import attention, rms_norm

    ops = (
        ("rms_norm_fwd", rms_norm.rms_norm_fwd),
        ("attention_fwd", attention.attention_fwd),
    )
    for name, op in ops:
        kernels = library_triton.get_triton_kernels_for_op(f"greta::{name}")
        assert isinstance(kernels, _ScannedOnRead)
        assert list(kernels) == list(library_triton.get_inner_triton_kernels(op._init_fn))
