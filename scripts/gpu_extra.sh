#!/usr/bin/env bash
# The GPU measurements beside the test suite, one device call per part (each fits in 10 min):
#
#   bash scripts/gpu_extra.sh install   # greta install's kernel-wheel step (sm_90 built on all
#                                       # cores, installed), first call vs warm in a new
#                                       # process, smoke test, TP block, build-time bench
#   bash scripts/gpu_extra.sh models    # bench/hf_llama.py --quick, binding overhead before/
#                                       # after, bench/fused_ops.py --quick
#   bash scripts/gpu_extra.sh overhead  # issue 13's host cost: binding overhead before/after
#                                       # (every op beside its PyTorch eager op, ratios), issue
#                                       # 25's forward+backward host time (grad_overhead), the
#                                       # direct launcher's GPU tests, eager layer_norm
#                                       # 4096/8192 vs torch.compile (greta bench)
#   bash scripts/gpu_extra.sh multi     # issue 14 on a machine of two GPUs or more: the GPU
#                                       # topology, a snapshot, greta doctor (multi_gpu.*),
#                                       # greta doctor --collective (NCCL, graph capture, two
#                                       # sizes), the tensor-parallel block under torchrun, the
#                                       # tests that need two GPUs
#
#   device run: command "bash scripts/gpu_extra.sh PART"  carry [".whl", ".devcarry"]
#
# .whl/ holds the pure-Python wheels the GPU machine lacks (see scripts/gpu_suite.sh);
# .devcarry/before/ an older tree for the side-by-side binding-overhead run (optional):
#   mkdir -p .devcarry/before && git archive 46b5be7 greta greta_core greta_install lock |
#     tar -x -C .devcarry/before
# Results: $OUT/summary.txt and $OUT/results.tar.gz (every log and result file).
set -u
cd "$(dirname "$0")/.."
REPO=$PWD
PART=${1:?usage: gpu_extra.sh install|models|overhead|multi}
OUT=${OUT:-$REPO/gpu-extra-out}
mkdir -p "$OUT"
WORK=$(mktemp -d -t greta-extra.XXXXXX)
SITE=$(mktemp -d -t greta-site.XXXXXX)
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false MPLBACKEND=Agg
# NVLink multicast stays off on the lent machines (and anywhere GRETA starts ranks).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export GRETA_CACHE_DIR="$WORK/greta-cache"
export PYTHONPATH="$REPO"
if compgen -G ".whl/*.whl" >/dev/null; then
    # Into the machine's own environment: isolated children (-I) must see them too.
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl
fi
START=$(date +%s)
run() { # NAME CAP COMMAND... : one step, its log kept, one summary line
    local name=$1 cap=$2
    shift 2
    local left=$((START + ${GRETA_EXTRA_BUDGET_S:-560} - $(date +%s)))
    ((cap > left)) && cap=$left
    if ((cap < 10)); then
        echo "$name SKIPPED (budget used up)" | tee -a "$WORK/summary.txt"
        return
    fi
    local t0=$(date +%s)
    timeout -k 10 "$cap" "$@" >"$WORK/$name.log" 2>&1
    local rc=$?
    echo "$name rc=$rc $(($(date +%s) - t0))s: $(grep -v '^\s*$' "$WORK/$name.log" | tail -n 1 | cut -c1-150)" |
        tee -a "$WORK/summary.txt"
}

case $PART in
install)
    # The kernel-wheel step alone against the preinstalled torch/triton: build sm_90 on all
    # cores (timed: "seconds" in kernels.json, progress lines in kernels.log), install it into
    # this machine's environment, warm; then again (cache reuse); then the first torch.ops.greta
    # call in new processes with the wheel installed; then the smoke test.
    export GRETA_KERNEL_CACHE="$WORK/kernel-wheel-cache"
    run kernels 400 bash -c "python3 -m greta install --only kernels --target cuda --arch sm_90 \
        --force-target --json > '$WORK/kernels.json'"
    run kernels_again 60 bash -c "python3 -m greta install --only kernels --target cuda \
        --arch sm_90 --force-target --json > '$WORK/kernels_again.json'"
    run first_call 150 python3 bench/first_kernel_call.py --op rms_norm --repeats 3 \
        --out "$WORK/first_kernel_call_h100"
    run smoke 150 bash -c "python3 -m greta smoke --json > '$WORK/smoke.json'"
    run tp_1rank 60 python3 -m torch.distributed.run --nproc-per-node 1 --master-addr 127.0.0.1 \
        --master-port 29511 examples/llama_block_tp.py --out "$WORK/tp"
    # Last, with what is left of the budget: the build alone, CPU time and first-line latency.
    run kernel_build_bench 200 python3 bench/kernel_build.py --arch sm_90 --jobs "$(nproc)" \
        --out "$WORK/kernel_build_sm90"
    ;;
models)
    run hf_llama 270 python3 bench/hf_llama.py --quick --out "$WORK/hf_llama"
    if [[ -d .devcarry/before/greta_core ]]; then
        run overhead_before 60 env PYTHONPATH="$REPO/.devcarry/before" \
            python3 bench/binding_overhead.py --label before-46b5be7 --out "$WORK/binding_overhead.json"
    fi
    run overhead_after 60 python3 bench/binding_overhead.py --label after --out "$WORK/binding_overhead.json"
    run fused_ops 150 python3 bench/fused_ops.py --quick --out "$WORK/fused_ops"
    ;;
overhead)
    if [[ -d .devcarry/before/greta_core ]]; then
        run overhead_before 90 env PYTHONPATH="$REPO/.devcarry/before" \
            python3 bench/binding_overhead.py --label before-46b5be7 --out "$WORK/binding_overhead.json"
    fi
    run overhead_after 90 python3 bench/binding_overhead.py --label after --out "$WORK/binding_overhead.json"
    # Issue 25: forward+backward host time per op with grads, GRETA vs PyTorch eager.
    run grad_overhead 120 python3 bench/grad_overhead.py --out "$WORK/grad_overhead.json"
    run direct_launch_tests 120 python3 -m pytest -q -p no:cacheprovider \
        tests/test_direct_launch.py tests/test_launch_plans.py
    run layer_norm_bench 240 python3 -m greta bench --preset standard --ops layer_norm \
        --out "$WORK/bench_layer_norm"
    ;;
multi)
    run topology 30 bash -c "nvidia-smi; nvidia-smi topo -m; nvidia-smi topo -p2p r; \
        nvidia-smi nvlink -s; python3 -c 'import torch; print(torch.cuda.device_count(), \
        torch.cuda.nccl.version())'"
    run snapshot 60 python3 -m greta snapshot "$WORK/snapshot"
    run doctor 150 bash -c "python3 -m greta doctor --json -v > '$WORK/doctor.json'"
    run collective 120 python3 -m greta doctor --collective --capture --json --out "$WORK/collective"
    run collective_256mb 120 python3 -m greta doctor --collective --size-mb 256 --iters 20 \
        --json --out "$WORK/collective"
    run tp_block 150 python3 -m torch.distributed.run --nproc-per-node 2 --master-addr 127.0.0.1 \
        --master-port 29512 examples/llama_block_tp.py --out "$WORK/tp"
    # Llama-3-8B's layer shape (dim 4096, 32/8 heads, MLP 14336), a 512-token prefill.
    run tp_block_8b 150 python3 -m torch.distributed.run --nproc-per-node 2 \
        --master-addr 127.0.0.1 --master-port 29513 examples/llama_block_tp.py --dim 4096 \
        --heads 32 --kv-heads 8 --hidden 14336 --batch 8 --prefill-len 512 --decode-steps 32 \
        --out "$WORK/tp"
    run tests_two_gpus 240 python3 -m pytest -q -p no:cacheprovider -rs \
        tests/test_doctor_collective.py tests/test_llama_block_tp.py \
        "tests/test_direct_launch.py::test_gpu_each_device_gets_its_own_kernel" \
        tests/test_doctor_multi_gpu.py
    ;;
*)
    echo "unknown part $PART" >&2
    exit 2
    ;;
esac

cp "$WORK/summary.txt" "$OUT/summary.txt"
for f in doctor.json smoke.json binding_overhead.json kernels.json kernels_again.json first_kernel_call_h100.json \
    kernel_build_sm90.json kernel_build_sm90.csv; do [[ -f "$WORK/$f" ]] && cp "$WORK/$f" "$OUT/$f"; done
tar -czf "$OUT/results.tar.gz" -C "$WORK" --exclude greta-cache --exclude kernel-wheel-cache .
rm -rf "$WORK" "$SITE"
cat "$OUT/summary.txt"
