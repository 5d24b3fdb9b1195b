#!/usr/bin/env bash
# Issue 11 evidence, "a test that failed before and passes after": the CURRENT tests/ (helpers
# and data included) run against the code of 46b5be7 (before issue 11's work) and against the
# code of this checkout; one row per test id with both outcomes.
#
#   bash scripts/failed_before.sh [pytest args, e.g. -n 2]
#
# Environment: PYTHON (default: python3) must have torch, triton, jax, pytest (xdist for -n).
# Output (local paths replaced by <repo>, <old>, <tmp>):
#   bench/results/issue11_failed_before/outcomes.csv  test_id,before,before_detail,now
#   bench/results/issue11_failed_before/summary.md    tallies and the 14 findings -> tests
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PYTHON=${PYTHON:-python3}
BASE=${GRETA_BEFORE_COMMIT:-46b5be7}
OUTDIR=$REPO/bench/results/issue11_failed_before
# The issue-11 reliability tests (found with `git log --stat 46b5be7..HEAD -- tests/` on the
# issue-11 branch): new files, plus the files whose issue-11 commits added tests.
FILES=(
    tests/test_install_reliability.py
    tests/test_install_transaction.py
    tests/test_data_safety.py
    tests/test_plan.py
    tests/test_kernel_edge_cases.py
)
WORK=$(mktemp -d -t greta-before.XXXXXX)
OLD=$WORK/old
cleanup() {
    git -C "$REPO" worktree remove --force "$OLD" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
git -C "$REPO" worktree add --detach --quiet "$OLD" "$BASE"
rm -rf "$OLD/tests"
cp -a "$REPO/tests" "$OLD/tests"
find "$OLD/tests" -name __pycache__ -prune -exec rm -rf {} +

run() {  # run DIR XML: the issue-11 files, fast marks only, from DIR as the package root
    local dir=$1 xml=$2
    (cd "$dir" && PYTHONPATH="$dir" GRETA_CACHE_DIR="$WORK/cache-$(basename "$xml" .xml)" \
        "$PYTHON" -m pytest -q -p no:cacheprovider -m 'not slow and not network' \
        --tb=short -o junit_family=xunit1 --junitxml="$xml" "${@:3}" "${FILES[@]}" \
        >"$WORK/$(basename "$xml" .xml).log" 2>&1) || true
}
run "$OLD" "$WORK/before.xml" "$@"
run "$REPO" "$WORK/now.xml" "$@"

mkdir -p "$OUTDIR"
if [ -n "${GRETA_BEFORE_KEEP:-}" ]; then  # the raw JUnit files, to re-render the report
    mkdir -p "$GRETA_BEFORE_KEEP" && cp "$WORK"/*.xml "$WORK"/*.log "$GRETA_BEFORE_KEEP"/
fi
"$PYTHON" "$REPO/scripts/failed_before_report.py" "$WORK/before.xml" "$WORK/now.xml" \
    "$OUTDIR" "$BASE" "$(git -C "$REPO" rev-parse --short HEAD)"
# No local path in committed output.
PREFIX=$("$PYTHON" -c 'import sys; print(sys.prefix)')
sed -i -e "s#$OLD#<old>#g" -e "s#$REPO#<repo>#g" -e "s#$WORK#<tmp>#g" -e "s#$PREFIX#<venv>#g" \
    -e "s#${TMPDIR:-/tmp}/[^ ,;:'\"]*#<tmp>#g" -e "s#$HOME#<home>#g" \
    "$OUTDIR/outcomes.csv" "$OUTDIR/summary.md"
echo "wrote $OUTDIR/outcomes.csv and $OUTDIR/summary.md"
