#!/usr/bin/env bash
# Run some tests N times in a row, each with another seed (GRETA_TEST_SEED) and another
# worker layout: pytest-xdist -n 0 / 1 / 2 in turn, and, where pytest-random-order is
# installed (it is not a test dependency: `pip install pytest-random-order`), every other
# run in a random test order (--random-order-seed=<run>), the rest in file order.
# One CSV row per run. Usage: scripts/repeat_tests.sh N OUT.csv TEST...
# REPEAT_FIRST=K numbers the runs K..K+N-1 (two halves can run side by side).
set -uo pipefail
runs=$1 out=$2
shift 2
cd "$(dirname "$0")/.."
have_order=$(.venv/bin/python -c 'import importlib.util as u; print(int(u.find_spec("random_order") is not None))')
echo "run,seed,workers,order,exit_code,seconds,summary" > "$out"
failed=0
first=${REPEAT_FIRST:-1}
for i in $(seq "$first" $(( first + runs - 1 ))); do
  workers=$(( i % 3 ))
  order="file"
  flags=()
  if [ "$have_order" = 1 ] && [ $(( i % 2 )) -eq 0 ]; then
    order="random:$i"
    flags=(--random-order-seed="$i")
  fi
  start=$(date +%s)
  log=$(mktemp)
  GRETA_TEST_SEED=$i .venv/bin/python -m pytest -q -p no:cacheprovider -n "$workers" \
    "${flags[@]}" "$@" > "$log" 2>&1
  code=$?
  summary=$(tail -1 "$log")
  rm -f "$log"
  echo "$i,$i,$workers,$order,$code,$(( $(date +%s) - start )),\"${summary//\"/}\"" >> "$out"
  [ "$code" -eq 0 ] || failed=$((failed + 1))
done
echo "$failed of $runs runs failed" >&2
[ "$failed" -eq 0 ]
