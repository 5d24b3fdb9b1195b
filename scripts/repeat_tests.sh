#!/usr/bin/env bash
# Run some tests N times in a row, each with another seed (GRETA_TEST_SEED) and worker
# layout (-n 1 / -n 2, random test order via -p no:cacheprovider and xdist's scheduling),
# and write one CSV row per run. Usage: scripts/repeat_tests.sh N OUT.csv TEST...
set -uo pipefail
runs=$1 out=$2
shift 2
cd "$(dirname "$0")/.."
echo "run,seed,workers,exit_code,seconds,tests" > "$out"
failed=0
for i in $(seq 1 "$runs"); do
  workers=$(( (i % 2) + 1 ))
  start=$(date +%s)
  GRETA_TEST_SEED=$i .venv/bin/python -m pytest -q -p no:cacheprovider -n "$workers" "$@" > /dev/null 2>&1
  code=$?
  echo "$i,$i,$workers,$code,$(( $(date +%s) - start )),\"$*\"" >> "$out"
  [ "$code" -eq 0 ] || failed=$((failed + 1))
done
echo "$failed of $runs runs failed" >&2
[ "$failed" -eq 0 ]
