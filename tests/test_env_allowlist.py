"""The env allowlist (issue 30, item 6, and item 9's message): a lock's `# greta-env:` lines,
the persisted greta-env.json, `greta env` and the start-up hook keep one rule: GPU-runtime
switches only, never a variable naming a program, library, path, index, file sink or one
of GRETA's test hooks, never a value that is a path, URL or argument list, at most
MAX_VARIABLES of them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _install_helpers import REPO

from greta_install.environment import envfix
from greta_install.locks.lockfile import LockError, parse_lock

LOCK = (REPO / "lock" / "targets" / "cpu-py311.txt").read_text()
LINE = "# greta-env: TRITON_INTERPRET=1"

DENIED_NAMES = [
    "GRETA_TEST_CHECKPOINT", "GRETA_TEST_CHECKPOINT_WAIT", "GRETA_TEST_CHECKPOINT_RELEASE",
    "GRETA_KERNEL_INDEX", "GRETA_KERNEL_CACHE", "TRITON_PTXAS_PATH", "TRITON_CUOBJDUMP_PATH",
    "TRITON_HIP_LLD_PATH", "TRITON_CACHE_DIR", "TRITON_CACHE_MANAGER",
    "TRITON_REMOTE_CACHE_BACKEND", "TRITON_DUMP_DIR", "XLA_FLAGS", "JAX_COMPILATION_CACHE_DIR",
    "HSA_TOOLS_LIB", "NCCL_NET_PLUGIN", "NCCL_DEBUG_FILE", "NCCL_TOPO_FILE", "TORCH_HOME",
    "TORCH_LOGS", "TORCH_EXTENSIONS_DIR", "CUDA_INJECTION64_PATH", "ROCM_PATH", "HIP_PATH",
    "MIOPEN_USER_DB_PATH", "PYTORCH_KERNEL_CACHE_PATH", "LD_PRELOAD", "PYTHONPATH",
]  # fmt: skip
DENIED_VALUES = [
    "bin/evil", "http://127.0.0.1:9/simple", "a b", "--xla_dump_to=dumps/d", "x\ty",
    "$(touch x)", "a;b", "..\\\\evil", "x" * (envfix.MAX_VALUE_CHARS + 1),
]  # fmt: skip
ALLOWED = {
    "JAX_PLATFORMS": "cpu", "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
    "PYTORCH_HIP_ALLOC_CONF": "expandable_segments:True", "HSA_OVERRIDE_GFX_VERSION": "11.0.0",
    "ROCR_VISIBLE_DEVICES": "0,1", "TRITON_INTERPRET": "1",
}  # fmt: skip


@pytest.mark.parametrize("name", DENIED_NAMES)
def test_a_lock_may_not_set_a_variable_that_names_a_program_path_index_or_hook(
    name: str,
) -> None:
    with pytest.raises(LockError, match=f"may not set {name}"):
        parse_lock(LOCK.replace(LINE, f"# greta-env: {name}=1", 1), check_header=True)
    with pytest.raises(envfix.EnvFixError):
        envfix.validate_env({name: "1"})


@pytest.mark.parametrize("value", DENIED_VALUES)
def test_a_lock_may_not_set_a_path_url_or_argument_list(value: str) -> None:
    with pytest.raises(LockError, match="may not set TRITON_INTERPRET: its value") as info:
        parse_lock(LOCK.replace(LINE, f"# greta-env: TRITON_INTERPRET={value}", 1))
    if len(value) > envfix.MAX_VALUE_CHARS:  # item 9: said as what it is
        assert "over the 4096-character limit" in str(info.value)


def test_the_shipped_and_planned_variables_stay_allowed() -> None:
    envfix.validate_env(ALLOWED)
    assert parse_lock(LOCK, check_header=True).env["TRITON_INTERPRET"] == "1"


def _many(n: int) -> dict[str, str]:
    return {f"GRETA_X{i}": "1" for i in range(n)}


def test_one_variable_limit_everywhere(tmp_path: Path) -> None:
    """A lock could set 100 variables, `greta env` printed 100, the hook applied 64."""
    others = len(parse_lock(LOCK).env) - 1  # the lock's own lines, less the one replaced
    fill = _many(envfix.MAX_VARIABLES - others)
    lines = "".join(f"# greta-env: {k}={v}\n" for k, v in fill.items())
    assert len(parse_lock(LOCK.replace(LINE, lines.strip(), 1)).env) == envfix.MAX_VARIABLES
    lines = "".join(f"# greta-env: {k}={v}\n" for k, v in _many(100).items())
    with pytest.raises(LockError, match=f"at most {envfix.MAX_VARIABLES}"):
        parse_lock(LOCK.replace(LINE, lines.strip(), 1))
    with pytest.raises(envfix.EnvFixError, match="over the limit"):
        envfix.validate_env(_many(100))
    site = _site(tmp_path, _many(100))
    with pytest.raises(envfix.EnvFixError, match="over the limit"):
        envfix.read_env_fixes(site)
    assert _applied(site, "GRETA_X0") == "None"  # all or nothing, never the first 64


def _site(tmp_path: Path, env: dict[str, str]) -> Path:
    site = tmp_path / "site"
    site.mkdir()
    envfix.write_env_fixes(site, {"TRITON_INTERPRET": "1"})
    (site / envfix.JSON_NAME).write_text(json.dumps({"schema": 1, "env": env}))
    return site


def _applied(site: Path, name: str) -> str:
    # The hook run as its file: this interpreter's own environment already imported a
    # `_greta_env` module at start-up.
    hook = str(site / envfix.HOOK_NAME)
    code = f"import runpy, os; runpy.run_path({hook!r}); print(os.environ.get({name!r}))"
    clean = {k: v for k, v in os.environ.items() if k != name and not k.startswith("GRETA_X")}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=clean, timeout=60,
        check=True,
    )  # fmt: skip
    return proc.stdout.strip()


@pytest.mark.parametrize("name", ["GRETA_TEST_CHECKPOINT", "TRITON_PTXAS_PATH", "XLA_FLAGS"])
def test_a_hand_written_env_file_cannot_arm_a_hook_or_a_program(tmp_path: Path, name: str) -> None:
    """The test hook (and the rest) stays inert: the start-up hook never sets it, `greta env`
    refuses the file, and a lock cannot write it."""
    site = _site(tmp_path, {name: "installer"})
    assert _applied(site, name) == "None"
    with pytest.raises(envfix.EnvFixError, match="remove it with `greta env --clear`"):
        envfix.read_env_fixes(site)
    assert name not in envfix.format_exports({name: "installer"})


def test_the_hook_applies_allowed_switches(tmp_path: Path) -> None:
    site = _site(tmp_path, ALLOWED)
    assert _applied(site, "PYTORCH_HIP_ALLOC_CONF") == "expandable_segments:True"
