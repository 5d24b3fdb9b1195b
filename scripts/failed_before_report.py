"""Render scripts/failed_before.sh's two JUnit files as outcomes.csv and summary.md.

python scripts/failed_before_report.py BEFORE.xml NOW.xml OUTDIR BASE HEAD
"""

from __future__ import annotations

import csv
import re
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

# A test of the current suite that cannot even import the API it tests on the old code shows
# only that the API is new, not that the old behaviour was wrong: kept apart from real failures.
_MISSING_API = re.compile(
    r"\b(ImportError|ModuleNotFoundError|cannot import name|has no attribute"
    r"|unexpected keyword argument|takes \d+ positional argument|missing \d+ required)"
)

# Issue 11's numbered findings -> the tests that replay them (file::function, any parameters).
_R, _D = "tests/test_install_reliability.py::", "tests/test_data_safety.py::"
_K, _P = "tests/test_kernel_edge_cases.py::", "tests/test_plan.py::"
FINDINGS: dict[int, tuple[str, list[str]]] = {
    1: ("Ctrl-C in the commit: a false message", [
        _R + "test_a_signal_in_the_commit_puts_everything_back",
    ]),
    2: ("two installs: one's rollback removes the other's packages", [
        _R + "test_two_installs_one_failing_keep_each_others_packages",
    ]),
    3: ("SIGKILL/TERM/HUP in the commit: half-installed, leftovers", [
        _R + "test_sigkill_in_the_commit_is_undone_by_the_next_run",
        _D + "test_recover_finishes_an_undo_after_a_kill",
        _D + "test_stale_stages_of_dead_installs_are_swept",
    ]),
    4: ("disk full: orphaned files; an orphan counted as a kernel wheel", [
        _D + "test_undo_removes_exactly_its_own_files_even_without_a_dist_info",
        _D + "test_undo_restores_a_directory_the_install_replaced_by_a_file",
        _D + "test_an_orphaned_kernel_package_is_not_an_installed_wheel",
    ]),
    5: ("unwritable env fixes: traceback, no rollback", [
        _R + "test_env_fixes_that_cannot_be_written_undo_the_install",
    ]),
    6: ("kernel wheel unverified (RECORD, manifest, content, hash, http)", [
        _D + "test_kernel_wheel_record_and_manifest_are_checked",
        _D + "test_kernel_wheel_content_is_confined",
        _R + "test_a_kernel_wheel_that_would_run_code_is_refused",
        _P + "test_kernel_wheel_found_in_a_directory",
    ]),
    7: ("`eval \"$(greta env)\"` runs commands", [_D + "test_greta_env_output_is_safe_to_eval"]),
    8: ("`python -m` children run code from the current directory", [
        _D + "test_python_children_ignore_the_current_directory",
    ]),
    9: ("snapshot follows symlinks out", [_D + "test_snapshot_never_follows_a_symlink_out"]),
    10: ("bad greta-env.json: traceback at every start", [
        _D + "test_a_bad_env_file_never_breaks_interpreter_start",
        _D + "test_greta_env_reports_a_bad_file_without_a_traceback",
        _D + "test_doctor_reports_a_bad_env_file",
    ]),
    11: ("unbounded reads and downloads, FIFOs, platform flags", [
        _D + "test_lock_from_a_device_or_fifo_is_refused_at_once",
        _D + "test_a_fifo_in_a_snapshot_does_not_hang_detect",
        _D + "test_downloads_are_bounded_and_https_only",
        _D + "test_lock_headers_are_validated",
    ]),
    12: ("lock semantics: markers, target, env lines", [
        _D + "test_environment_markers_are_honoured",
        _D + "test_a_lock_for_another_target_is_refused_unless_forced",
        _D + "test_a_lock_cannot_set_the_loader_or_python",
    ]),
    13: ("kernels: NaN, lengths, int32, Skv=0, dtypes, stride-0 cache", [
        _K + "test_attention_reference_propagates_nan_like_sdpa",
        _K + "test_attention_kernel_propagates_nan_like_sdpa",
        _K + "test_jax_attention_reference_propagates_nan",
        _K + "test_attention_rows_without_keys_stay_zero",
        _K + "test_attention_negative_lengths_refused",
        _K + "test_raw_attention_negative_lengths_refused",
        _K + "test_jax_attention_negative_lengths_refused",
        _K + "test_jax_attention_without_keys_gives_zeros",
        _K + "test_jax_kv_cache_capacity_check_does_not_wrap_int32",
        _K + "test_raw_kv_cache_positions_do_not_wrap_int32",
        _K + "test_torch_ops_refuse_integer_dtypes_on_cpu",
        _K + "test_kv_cache_refuses_a_broadcast_cache",
        _K + "test_raw_kv_cache_refuses_a_broadcast_cache",
    ]),
    14: ("misleading messages (cross-device, bad --python, build-kernels)", [
        _D + "test_put_back_across_filesystems_and_identical_files",
        _D + "test_bad_python_is_explained",
        _D + "test_build_kernels_reports_only_wheels_it_built",
    ]),
}  # fmt: skip


def _tid(case: ET.Element) -> str:
    cls, name = case.get("classname", ""), case.get("name", "")
    if not cls:  # a collection error: its name is the module
        return name.replace(".", "/") + ".py"
    parts = cls.split(".")
    for i in range(len(parts), 0, -1):  # tests.test_x[.TestClass]
        if parts[i - 1].startswith("test_"):
            return "/".join(parts[:i]) + ".py::" + "::".join([*parts[i:], name])
    return f"{cls}::{name}"


def _outcome(case: ET.Element) -> tuple[str, str]:
    for tag in ("failure", "error"):
        el = case.find(tag)
        if el is not None:
            msg = (el.get("message") or "") + "\n" + (el.text or "")
            first = next((ln.strip() for ln in msg.splitlines() if ln.strip()), "")[:160]
            if "crashed while running" in msg:  # the old code killed the test process
                return "crashed", first
            if not case.get("classname"):
                return "error at collection", first
            if tag == "error":
                return "error in setup", first
            # The raised exception itself, not text it quotes (an assertion on a child's
            # stderr may show that child's ImportError: that is the old behaviour failing).
            if _MISSING_API.search(first) and not first.startswith("AssertionError"):
                return "failed (new API missing)", first
            return "failed", first
    if case.find("skipped") is not None:
        return "skipped", (case.find("skipped").get("message") or "")[:160]  # type: ignore[union-attr]
    return "passed", ""


def _read(path: Path) -> dict[str, tuple[str, str]]:
    return {_tid(c): _outcome(c) for c in ET.parse(path).getroot().iter("testcase")}


def _before(tid: str, before: dict[str, tuple[str, str]]) -> tuple[str, str]:
    if tid in before:
        return before[tid]
    module = tid.split("::")[0]
    if module in before and before[module][0] == "error at collection":
        return before[module]
    return "not collected", "absent from the old run (parameters or marks differ)"


def main() -> None:
    before_xml, now_xml, outdir, base, head = sys.argv[1:6]
    before, now = _read(Path(before_xml)), _read(Path(now_xml))
    rows = []
    for tid in sorted(now):
        b, detail = _before(tid, before)
        rows.append((tid, b, detail, now[tid][0]))
    out = Path(outdir)
    with (out / "outcomes.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["test_id", "before", "before_detail", "now"])
        w.writerows(rows)
    tally = Counter((b, n) for _, b, _, n in rows)
    lines = [
        "# Issue 11: the current tests on the code before (46b5be7) and now",
        "",
        f"Produced by `bash scripts/failed_before.sh` (code before: {base}; now: {head}; the",
        "current `tests/` copied into both; `-m 'not slow and not network'`). One row per test",
        'in `outcomes.csv`. "failed (new API missing)" is a failure whose message is an import',
        "or signature error: the test could not reach the old behaviour, so it shows only that",
        'the API is new (weak evidence). "error at collection" is a whole file that did not',
        "import on the old code (equally weak).",
        "",
        "| before | now | tests |",
        "|---|---|---|",
    ]
    lines += [f"| {b} | {n} | {c} |" for (b, n), c in sorted(tally.items())]
    if FINDINGS:
        lines += [
            "",
            "## The 14 findings of issue 11 and their tests",
            "",
            "Evidence per test: **strong** = it failed on the old code at an assertion or with the",
            "old code's own error, or crashed the test process; **weak** = it could only fail to",
            "import or set up the new API; **none** = it passed on the old code too; the slow",
            "sweeps (kill sweeps, concurrent sweep, disk full) are not in this run.",
        ]
        for num, (title, prefixes) in sorted(FINDINGS.items()):
            lines += ["", f"### {num}. {title}", "", "| test | before | now | evidence |"]
            lines += ["|---|---|---|---|"]
            for prefix in prefixes:
                hit = [r for r in rows if r[0].split("[")[0] == prefix]
                if not hit:
                    lines.append(f"| `{prefix.split('::')[1]}` | (not in this run) | | |")
                    continue
                bt = Counter(r[1] for r in hit)
                nt = Counter(r[3] for r in hit)
                strong = bt["failed"] + bt["crashed"]
                weak = (
                    bt["failed (new API missing)"]
                    + bt["error at collection"]
                    + bt["error in setup"]
                )
                evidence = "strong" if strong else "weak" if weak else "none"
                lines.append(
                    f"| `{prefix.split('::')[1]}` | "
                    + ", ".join(f"{v} {k}" for k, v in sorted(bt.items()))
                    + " | "
                    + ", ".join(f"{v} {k}" for k, v in sorted(nt.items()))
                    + f" | {evidence} |"
                )
    lines += [
        "",
        "## Notes",
        "",
        "- 46b5be7 is before issue 10's merge as well: most `test_plan.py` failures before are",
        "  issue 10's matrix rows and plan fields, not issue 11 (only",
        "  `test_kernel_wheel_found_in_a_directory` there is issue 11's, finding 6).",
        "- A weak row is a test of a module or argument issue 11 added (`transaction`,",
        "  `boundedio`, `verify_kernel_wheel`, `parse_lock(check_header=)`, ...): the old code",
        "  had no such unit to test, so only an end-to-end test could fail on it for real.",
        "- `test_attention_rows_without_keys_stay_zero` guards the other half of the NaN rule",
        "  (rows that see no key are zeros), which the old code already kept.",
    ]
    (out / "summary.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
