"""scripts/gpu_stack.py: which of the image's distributions go when the locked torch comes in."""

from __future__ import annotations

import pytest
from _script_module import load_script

gpu_stack = load_script("scripts/gpu_stack.py", "greta_test_gpu_stack")

LOCK = {"torch": "2.15.0", "triton": "3.9.0", "transformers": "5.24.0", "jax": "0.12.0"}
# What the lent machine's image holds beside the lock's torch 2.15.0 (Requires-Dist lines as
# their metadata has them).
IMAGE = [
    ("torch", ["filelock", "triton==3.9.0; platform_system == 'Linux'"]),
    ("torchaudio", []),  # torchaudio 2.11 declares no torch requirement
    ("torchvision", ["numpy", "torch==2.11.0"]),
    ("xformers", ["torch>=2.10; extra == 'cuda'", "numpy"]),
    ("accelerate", ["torch>=2.0.0", "numpy"]),
    ("flash_attn", ["torch==2.11.0"]),
    ("transformers", ["torch>=2.2; extra == 'torch'"]),
    ("numpy", []),
]


def test_companions_and_unmet_torch_requirements_go() -> None:
    gone = gpu_stack.built_for_another_torch(IMAGE, "2.15.0", LOCK)
    assert set(gone) == {"torchaudio", "torchvision", "flash_attn"}
    assert gone["torchvision"] == "torch==2.11.0"
    assert gone["flash_attn"] == "torch==2.11.0"
    assert "compiled against one torch build" in gone["torchaudio"]


def test_a_companion_the_lock_pins_stays() -> None:
    pinned = {**LOCK, "torchvision": "0.30.0", "torchaudio": "2.15.0"}
    gone = gpu_stack.built_for_another_torch(IMAGE, "2.15.0", pinned)
    assert set(gone) == {"flash_attn"}


def test_companions_the_lock_does_not_pin_go_whatever_they_declare() -> None:
    gone = gpu_stack.built_for_another_torch(IMAGE, "2.11.0", LOCK)
    assert set(gone) == {"torchaudio", "torchvision"}


REPORT = {
    "installed": {"torch": "2.15.0", "triton": "3.9.0", "torchvision": "0.29.1"},
    "already_at_lock_version": {"jax": "0.12.0"},
    # install carries torchvision (the image's transformers imports it), then removes it where
    # the lock pins none: its absence is the stack's, not a failed install.
    "removed_for_another_torch": {"torchvision": "compiled against one torch build"},
}


def test_the_installed_stack_is_held_at_its_versions() -> None:
    have = {"torch": "2.15.0+cu132", "triton": "3.9.0", "jax": "0.12.0"}  # a local tag is fine
    assert gpu_stack.not_held(REPORT, have.get) == []


def test_the_image_torch_or_a_missing_package_is_not_the_stack() -> None:
    have = {"torch": "2.11.0+cu130", "jax": "0.12.0"}
    problems = gpu_stack.not_held(REPORT, have.get)
    assert problems == [
        "torch 2.11.0+cu130 is importable, not the stack's 2.15.0",
        "triton is not installed (the stack's 3.9.0)",
    ]


def test_no_install_report_is_not_the_stack(tmp_path) -> None:
    with pytest.raises(SystemExit) as stop:
        gpu_stack.main(["check", "--stack", str(tmp_path)])
    assert "no install report" in str(stop.value.code)
