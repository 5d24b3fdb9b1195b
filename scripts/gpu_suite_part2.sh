#!/usr/bin/env bash
# Second GPU call: the llama block (eager / GretaGraph / compile), the sm_90 kernel wheel
# built on the GPU machine and its first-call timing against a cold JIT, and `greta tune`
# for the bandwidth-bound ops. Results land in $OUT (at most 8 files come back).
#
#   device run:  command "bash scripts/gpu_suite_part2.sh"   carry [".whl"]   timeout_s 600
set -u
cd "$(dirname "$0")/.."
REPO=$PWD
OUT=${OUT:-$REPO/gpu-suite-out}
mkdir -p "$OUT"
WORK=$(mktemp -d -t greta-suite2.XXXXXX)
SITE=$(mktemp -d -t greta-site.XXXXXX)
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false MPLBACKEND=Agg
export PYTHONPATH="$REPO"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" .whl/*.whl && export PYTHONPATH="$PYTHONPATH:$SITE"
fi
run() { # NAME CAP COMMAND...
    local name=$1 cap=$2; shift 2
    local t0=$(date +%s)
    timeout -k 10 "$cap" "$@" >"$WORK/$name.log" 2>&1
    echo "$name rc=$? $(($(date +%s) - t0))s: $(grep -v '^\s*$' "$WORK/$name.log" | tail -n 1 | cut -c1-120)" | tee -a "$WORK/summary.txt"
}
if [[ ${GRETA_SUITE_LLAMA:-1} == 1 ]]; then
    run llama 200 python3 examples/llama_block.py --batch 1,8,32 --dim 4096 --heads 32 --kv-heads 8 \
        --prefill-len 128 --decode-steps 32 --out "$WORK/llama"
fi
for op in rms_norm layer_norm softmax; do
    run "tune_$op" 60 python3 -m greta tune --op "$op" --arch current \
        --out "$WORK/tuned_sm_90.json" --results "$WORK/tune_$op.json"
done
if [[ -f "$WORK/tuned_sm_90.json" ]]; then
    # This machine's copy of the tree only: measure the tuned table before committing it.
    cp greta_core/configs/tables/sm_90.json "$WORK/shipped_sm_90.json"
    cp "$WORK/tuned_sm_90.json" greta_core/configs/tables/sm_90.json
    run bench_norms 120 python3 -m greta bench --preset perf --ops rms_norm layer_norm softmax \
        --no-compile --out "$WORK/bench_norms"
    cp "$WORK/shipped_sm_90.json" greta_core/configs/tables/sm_90.json
fi
run build_wheel 200 python3 -m greta build-kernels --arch sm_90 --variants aligned \
    --kernels vec_add,matmul,rms_norm,layer_norm,softmax --out "$WORK/dist"
WHEEL=$(ls "$WORK"/dist/greta_kernels_sm_90-*.whl 2>/dev/null | head -n 1)
if [[ -n $WHEEL ]]; then
    run first_call 150 python3 bench/first_call.py --wheel "$WHEEL" \
        --ops vec_add,matmul,rms_norm,layer_norm,softmax --repeats 3 --out "$WORK/first_call"
fi
cp "$WORK/summary.txt" "$OUT/summary2.txt"
[[ -f "$WORK/tuned_sm_90.json" ]] && cp "$WORK/tuned_sm_90.json" "$OUT/"
for f in llama/*.json llama/*.csv first_call/*.json first_call/*.csv bench_norms/bench.json; do
    [[ -f "$WORK/$f" ]] && cp "$WORK/$f" "$OUT/"
done
tar -czf "$OUT/suite2.tar.gz" -C "$WORK" --exclude=dist .
rm -rf "$WORK" "$SITE"
cat "$OUT/summary2.txt"
