#!/usr/bin/env bash
# Two torchrun "nodes" on one host: the multi-node proof of `greta doctor --cluster`,
# `greta doctor --collective` and examples/llama_block_tp.py.
#
#   scripts/cluster_gpu.sh          # GPU mode: 2 GPUs, one per node (NCCL/RCCL)
#   scripts/cluster_gpu.sh --cpu    # CPU mode: the same steps with gloo (checks the script)
#   NODES=4 scripts/cluster_gpu.sh                    # 4 nodes of one GPU (a 4-GPU machine)
#   NODES=2 GPUS_PER_NODE=2 scripts/cluster_gpu.sh    # 2 nodes of two GPUs
#
# Run from the repository root (PYTHONPATH = the repository, or GRETA installed). Each node is
# a separate `torchrun --nnodes $NODES --node-rank N --nproc-per-node $GPUS_PER_NODE` on
# 127.0.0.1 with its own CUDA_VISIBLE_DEVICES/HIP_VISIBLE_DEVICES; every step has its own
# free port and a hard time limit. Results go to $OUT (7 files: machine.json, cluster.json, collective.json,
# collective.csv, llama_block_tp.json, summary.csv, logs.txt); the summary table comes last.
# Nothing here is a launcher of GRETA's own: torchrun and torch.distributed do the work.
set -u

MODE=gpu
[ "${1:-}" = "--cpu" ] && MODE=cpu
NODES=${NODES:-2}
PER=${GPUS_PER_NODE:-1}
PY=${PYTHON:-python3}
OUT=${OUT:-$PWD/cluster-results}
mkdir -p "$OUT"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
LOG="$OUT/logs.txt"
: >"$LOG"
export PYTHONPATH=${PYTHONPATH:-$PWD}
# NVLink multicast stays off on the shared machines; gloo (the records' gather) stays on
# loopback, which is what exists on a machine without a network.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

free_port() {
    "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# nodes NAME LIMIT_S -- ARGS...: one torchrun per node, all waited for, exit codes in
# $WORK/NAME.rc ("rc0 rc1 ..."); outputs appended to logs.txt.
nodes() {
    local name=$1 limit=$2
    shift 3
    local port pids=() n
    port=$(free_port)
    for ((n = 0; n < NODES; n++)); do
        local dev=()
        if [ "$MODE" = gpu ]; then
            local ids
            ids=$(seq -s, $((n * PER)) $((n * PER + PER - 1)))
            dev=(env CUDA_VISIBLE_DEVICES=$ids HIP_VISIBLE_DEVICES=$ids)
        fi
        ${dev[@]+"${dev[@]}"} timeout -k 10 "$limit" "$PY" -m torch.distributed.run \
            --nnodes "$NODES" --node-rank "$n" --nproc-per-node "$PER" \
            --master-addr 127.0.0.1 --master-port "$port" \
            "$@" >"$WORK/$name.node$n.out" 2>&1 &
        pids+=($!)
    done
    local rcs=()
    for ((n = 0; n < NODES; n++)); do
        wait "${pids[$n]}"
        rcs+=($?)
    done
    echo "${rcs[*]}" >"$WORK/$name.rc"
    for ((n = 0; n < NODES; n++)); do
        {
            echo "===== $name node $n (exit ${rcs[$n]}) ====="
            tail -n 80 "$WORK/$name.node$n.out"
        } >>"$LOG"
    done
}

echo "cluster_gpu.sh: mode $MODE, $NODES nodes x $PER rank(s), results in $OUT" >&2

# 0. The machine and its versions.
timeout 60 "$PY" - "$MODE" >"$OUT/machine.json" 2>>"$LOG" <<'EOF'
import datetime, json, platform, shutil, socket, subprocess, sys
import torch
out = {
    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "mode": sys.argv[1], "host": socket.gethostname(), "platform": platform.platform(),
    "python": platform.python_version(), "torch": torch.__version__,
    "cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None),
    "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
}
if torch.cuda.is_available():
    try:
        out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception as exc:
        out["nccl"] = f"unknown ({exc})"
if shutil.which("nvidia-smi"):
    q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                        "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
    out["nvidia_smi"] = q.stdout.strip().splitlines()
print(json.dumps(out, indent=2))
EOF

if [ "$MODE" = gpu ]; then
    ngpu=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>>"$LOG")
    if [ "${ngpu:-0}" -lt $((NODES * PER)) ]; then
        echo "cluster_gpu.sh: needs $((NODES * PER)) GPUs, torch sees ${ngpu:-0}" \
            "(use --cpu for the gloo mode)" >&2
        exit 2
    fi
fi

# 1. greta doctor --cluster across the two nodes.
nodes cluster 120 -- -m greta doctor --cluster --out "$WORK/cluster" --collective-timeout 90
cp "$WORK"/cluster/cluster_*.json "$OUT/cluster.json" 2>/dev/null

# 2. greta doctor --collective across the two nodes (graph capture on GPUs).
coll=(--collective --collective-timeout 150 --out "$WORK/collective")
[ "$MODE" = gpu ] && coll+=(--capture) || coll+=(--cpu --iters 5)
nodes collective 180 -- -m greta doctor "${coll[@]}"
cp "$WORK"/collective/collective_job_*.json "$OUT/collective.json" 2>/dev/null
cp "$WORK"/collective/collective_job_*.csv "$OUT/collective.csv" 2>/dev/null

# 3. The tensor-parallel Llama block over the two nodes against one device (rank 0's).
ex=(examples/llama_block_tp.py --out "$WORK/example")
[ "$MODE" = cpu ] && ex+=(--device cpu --dim 64 --heads 4 --kv-heads 2 --prefill-len 7 \
    --decode-steps 3 --repeats 1)
nodes example 180 -- "${ex[@]}"
cp "$WORK"/example/llama_block_tp_*.json "$OUT/llama_block_tp.json" 2>/dev/null

# 4. The summary: a CSV and, last, the table.
"$PY" - "$OUT" "$WORK" <<'EOF'
import csv, json, sys
from pathlib import Path

out, work = Path(sys.argv[1]), Path(sys.argv[2])

def load(name):
    try:
        return json.loads((out / name).read_text())
    except (OSError, ValueError):
        return None

def rc(step):
    try:
        return (work / f"{step}.rc").read_text().split()
    except OSError:
        return ["?"]

machine = load("machine.json") or {}
rows = []
c = load("cluster.json")
if c:
    counts = {s: sum(f["status"] == s for f in c["findings"]) for s in ("ok", "warn", "fail")}
    bad = [f"{f['id']}: {f['finding'][:90]}" for f in c["findings"] if f["status"] in ("warn", "fail")]
    rows.append(("cluster", rc("cluster"), "fail" if counts["fail"] else "pass",
                 f"{counts['ok']} ok, {counts['warn']} warn, {counts['fail']} fail"
                 + (f" | {bad[0]}" if bad else "")))
else:
    rows.append(("cluster", rc("cluster"), "no result", "see logs.txt"))
k = load("collective.json")
if k:
    r = k["result"]
    last = r["rows"][-1] if r["rows"] else {}
    gate = "none" if r["threshold_gbps"] is None else f"{r['threshold_gbps']:g} GB/s"
    detail = (f"{r['backend']} {r['link']}: all-reduce busbw "
              f"{last.get('all_reduce_busbw', 0):.2f} GB/s at {last.get('bytes', 0) / 2**20:g} MiB"
              f" (gate {gate})")
    if "graph_capture" in r["result"]:
        detail += f", graph capture {r['result']['graph_capture'][:40]}"
    rows.append(("collective", rc("collective"), "pass" if r["status"] == "ok" else r["status"],
                 detail if r["status"] == "ok" else r["message"][:160]))
else:
    rows.append(("collective", rc("collective"), "no result", "see logs.txt"))
e = load("llama_block_tp.json")
if e:
    modes = ", ".join(
        f"{m} decode {v['decode_step_ms']:.3f} ms (one device {v['single_device_decode_step_ms']:.3f})"
        for m, v in e["modes"].items())
    rows.append(("example", rc("example"), "pass" if e["match"] else "FAIL",
                 f"x{e['world']} {e['device']} {e['dtype']}: rel_err vs one device "
                 f"{e['rel_err_vs_single_device']:.1e} (tol {e['tolerance']:.0e}); {modes}"))
else:
    rows.append(("example", rc("example"), "no result", "see logs.txt"))
with open(out / "summary.csv", "w", newline="") as fh:
    w = csv.writer(fh)
    w.writerow(["date", "mode", "host", "gpus", "torch", "cuda", "hip", "nccl", "step",
                "exit_per_node", "verdict", "detail"])
    for step, codes, verdict, detail in rows:
        w.writerow([machine.get("date"), machine.get("mode"), machine.get("host"),
                    "; ".join(machine.get("gpus", [])), machine.get("torch"), machine.get("cuda"),
                    machine.get("hip"), machine.get("nccl"), step, "/".join(codes), verdict,
                    detail])
gpus = ", ".join(machine.get("gpus") or ["cpu"])
print(f"\ncluster_gpu.sh ({machine.get('mode')}): {gpus}; torch {machine.get('torch')}, "
      f"CUDA {machine.get('cuda')}, HIP {machine.get('hip')}, NCCL {machine.get('nccl')}")
print(f"{'step':<11} {'exit':<8} {'verdict':<10} detail")
for step, codes, verdict, detail in rows:
    print(f"{step:<11} {'/'.join(codes):<8} {verdict:<10} {detail}")
EOF
