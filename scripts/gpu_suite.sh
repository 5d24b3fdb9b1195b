#!/usr/bin/env bash
# GRETA's GPU suite: the one command run on the lent NVIDIA machine (no network there).
#
#   device run:  command "bash scripts/gpu_suite.sh"   carry [".whl"]   timeout_s 600
#
# Before it, once, in the repository root of this machine (jax-triton is not installed there):
#   echo /.whl/ >> .git/info/exclude
#   for p in jax-triton==0.3.1 platformdirs liger-kernel; do
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp -d .whl "$p"; done
#
# Steps (each under its own `timeout`, none stopping the others; all within the suite's
# budget, GRETA_SUITE_BUDGET_S, 560 s by default): the three compat prototypes,
# `greta backends --json`, `greta doctor --json`, `greta smoke --json`, pytest (-n 8, not slow, GPU tests included;
# GRETA_SUITE_MARKS picks other tests, GRETA_SUITE_JOBS the worker count),
# `greta bench --preset perf`, examples/llama_block.py and bench/first_call.py when present.
#
# $OUT brings back at most 8 files, 2 folders deep, so the suite leaves exactly:
#   summary.txt  pytest.log  bench.csv  bench.json  bench.png  backends.json  doctor.json
#   suite.tar.gz (everything: every step's log, bench/, llama/, first_call/, ...)
set -u
cd "$(dirname "$0")/.."
REPO=$PWD
OUT=${OUT:-$REPO/gpu-suite-out}
mkdir -p "$OUT"
WORK=$(mktemp -d -t greta-suite.XXXXXX)
mkdir -p "$WORK/logs"
START=$(date +%s)
TOTAL=${GRETA_SUITE_BUDGET_S:-560}

export PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false # JAX and torch share the GPU in one process
export MPLBACKEND=Agg
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

SUMMARY=()
note() { SUMMARY+=("$1"); }

if compgen -G ".whl/*.whl" >/dev/null; then
    # Into the machine's own environment (it is lent bare and given back): child processes
    # run isolated (-I) or from fresh paths and must see them as an install would.
    if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        .whl/*.whl >"$WORK/logs/wheels.log" 2>&1; then
        note "$(printf '%-13s %-14s %s' wheels ok "$(cd .whl && ls ./*.whl | tr '\n' ' ')")"
    else
        note "$(printf '%-13s %-14s %s' wheels FAILED "see logs/wheels.log")"
    fi
else
    note "$(printf '%-13s %-14s %s' wheels none "no .whl/ carried: jax-triton may be missing")"
fi

# GRETA itself, installed as a user's would be (editable, no index, no build isolation): the
# children GRETA starts run isolated (`python -I`, which drops PYTHONPATH) and must find the
# installed GRETA, and `greta smoke` checks the GRETA bindings only where GRETA is installed.
if python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir -e . \
    >"$WORK/logs/greta.log" 2>&1; then
    note "$(printf '%-13s %-14s %s' greta ok "installed editable from $REPO")"
else
    note "$(printf '%-13s %-14s %s' greta FAILED "see logs/greta.log")"
fi

# step NAME CAP_S [tee] -- COMMAND...: run COMMAND with a timeout of min(CAP, time left).
step() {
    local name=$1 cap=$2 mode=$3
    shift 4
    local left=$((START + TOTAL - $(date +%s)))
    local limit=$((cap < left ? cap : left))
    local log="$WORK/logs/$name.log"
    if ((limit < 10)); then
        note "$(printf '%-13s %-14s %s' "$name" SKIPPED "suite budget of ${TOTAL}s used up")"
        return
    fi
    local t0 rc
    t0=$(date +%s)
    if [[ $mode == tee ]]; then
        timeout -k 10 "$limit" "$@" 2>&1 | tee "$log"
        rc=${PIPESTATUS[0]}
    else
        timeout -k 10 "$limit" "$@" >"$log" 2>&1
        rc=$?
    fi
    local verdict=ok
    if ((rc == 124 || rc == 137)); then verdict="TIMEOUT(${limit}s)"; elif ((rc != 0)); then verdict="rc=$rc"; fi
    local last
    last=$(grep -v '^\s*$' "$log" | tail -n 1 | cut -c1-110)
    note "$(printf '%-13s %-14s %4ss  %s' "$name" "$verdict" "$(($(date +%s) - t0))" "$last")"
}

COMMIT=${GRETA_SUITE_COMMIT:-$(git rev-parse HEAD 2>/dev/null || cat COMMIT 2>/dev/null || echo unknown)}
# The files' own git tree: a copied checkout's HEAD can lag the files it holds (the lent GPU
# machines'), and `git rev-parse C^{tree}` of the commit C that ran equals this.
TREE=$(python3 -c 'from greta_core.bench.metadata import git_commit; print(git_commit()["tree"])' 2>/dev/null || echo unknown)
STACK=${GRETA_STACK:-image}
STACK_DIR=${GRETA_STACK_DIR:-/tmp/stack}
# A result must name the stack it ran on: "locked ..." with the image's torch still importable
# (an install that refused, or never ran) stops here, before any step.
if [[ $STACK == locked* ]] && ! why=$(python3 scripts/gpu_stack.py check --stack "$STACK_DIR" 2>&1); then
    echo "GRETA_STACK=$STACK, but: $why" | tee "$OUT/summary.txt"
    exit 2
fi
# On the locked stack, do what `greta doctor`'s cuda.ptxas tells a user: the environment's
# NVIDIA wheel ptxas first on PATH. XLA assembles jax-triton's kernels with the first ptxas
# it finds, and the image's CUDA 13.0 one refuses Triton 3.9's PTX ("Unsupported .version").
if [[ $STACK == locked* ]]; then
    if PTXAS_DIR=$(python3 -m greta_install.environment.ptxas --wheel-dir 2>/dev/null); then
        export PATH="$PTXAS_DIR:$PATH"
        note "$(printf '%-13s %-14s %s' ptxas wheel "first on PATH: $PTXAS_DIR ($(ptxas --version | grep -o 'release [0-9.]*'))")"
    else
        note "$(printf '%-13s %-14s %s' ptxas system "no NVIDIA wheel ptxas here: $(command -v ptxas || echo none) stays first")"
    fi
fi
python3 - "$STACK" "$COMMIT" "$TREE" "$STACK_DIR" >"$WORK/versions.txt" 2>&1 <<'PY'
import importlib.metadata as md, json, pathlib, sys
names = ("torch", "triton", "jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda13-pjrt", "jax-triton",
         "transformers", "torchvision", "nvidia-nccl-cu13", "numpy")
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "-"
print(f"stack: {sys.argv[1]}   commit: {sys.argv[2]}   tree: {sys.argv[3]}")
print("versions: " + " ".join(f"{n}=={version(n)}" for n in names))
try:
    import torch
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "-"
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    print(f"gpu: {gpu}   torch.version.cuda: {torch.version.cuda}   nccl (loaded): {nccl}")
except Exception as exc:  # the header must still be written
    print(f"torch import failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
stack = pathlib.Path(sys.argv[4]) / "installed.json"
if stack.is_file():
    doc = json.loads(stack.read_text())
    print(f"installed from: {doc['lock']} (input {doc['lock_input']}); not in the lock: "
          + (", ".join(doc["not_in_lock"]) or "none"))
    gone = doc.get("removed_for_another_torch", {})
    print("removed (built for another torch): "
          + (", ".join(f"{n} ({r})" for n, r in gone.items()) or "none"))
    other = doc.get("differs_from_lock", {})
    print(f"pins at another version than the lock ({len(other)}): "
          + (", ".join(f"{n} {h} (lock {w})" for n, (h, w) in other.items()) or "none"))
PY
note "$(printf '%-13s %s' stack "$STACK @ $COMMIT")"

step env 30 log -- bash -c 'nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader;
    python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, torch.version.cuda, triton.__version__, torch.cuda.is_available())";
    python3 -c "import jax; print(jax.__version__, jax.devices())";
    python3 -c "
try:
    import jax_triton; print(\"jax_triton\", jax_triton.__version__)
except Exception as exc:
    print(\"jax_triton not importable:\", str(exc).splitlines()[0])"'
step compat_triton 45 log -- python3 compat/triton/vec_add.py
step compat_torch 45 log -- python3 compat/pytorch/greta_extension_hello.py
step compat_jax 60 log -- python3 compat/jax/jax_custom_call_hello.py
step backends 30 log -- bash -c "python3 -m greta backends --json > '$WORK/backends.json'"
step doctor 45 log -- bash -c "python3 -m greta doctor --json > '$WORK/doctor.json'"
# The install gate as a user runs it, on the machine's own stack (every check, with its
# numbers, in suite.tar.gz's smoke.json; GRETA's bindings are skipped unless GRETA is
# installed here: tests/test_smoke.py's gpu test runs them through an environment that has it).
step smoke 120 log -- bash -c "python3 -m greta smoke --mode gpu --json > '$WORK/smoke.json'"
# xdist over the machine's cores: serially the suite needs ~10 minutes on the H100, with
# -n 8 about 200 s. GRETA_SUITE_MARKS="slow and not network" runs the release-check tests.
MARKS=${GRETA_SUITE_MARKS:-not slow and not network}
JOBS=${GRETA_SUITE_JOBS:-8}
step pytest 330 tee -- python3 -m pytest -q -n "$JOBS" -m "$MARKS" -p no:cacheprovider ${GRETA_SUITE_TESTS:-tests/}
# GRETA_SUITE_BENCH=0 leaves the bench out (a call that must also install a stack first).
[[ ${GRETA_SUITE_BENCH:-1} == 0 ]] || step bench 150 log -- python3 -m greta bench --preset perf --out "$WORK/bench" --budget-s 100
# The llama block, the kernel wheel's first-call timing and tuning run in
# scripts/gpu_suite_part2.sh (a second device call: one call is capped at 10 minutes).

# --- what comes back ------------------------------------------------------------------
{
    echo "=== GRETA GPU suite ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(($(date +%s) - START)) s) ==="
    cat "$WORK/versions.txt"
    printf '%s\n' "${SUMMARY[@]}"
    echo
    echo "--- compat ---"
    for f in compat_triton compat_torch compat_jax; do
        [[ -f "$WORK/logs/$f.log" ]] && printf '%-14s %s\n' "$f" "$(grep '^STATUS=' "$WORK/logs/$f.log" | tail -n 1)"
    done
    echo
    echo "--- smoke (greta smoke --json) ---"
    if [[ -s "$WORK/smoke.json" ]]; then
        python3 - "$WORK/smoke.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"ok={r['ok']} mode={r['mode']} {r['seconds']}s counts={r['counts']} failed={r['failed']}")
for s in r["steps"]:
    d = s.get("detail") or {}
    ratio = d.get("max_err_over_bound") if isinstance(d, dict) else None
    ratio = max(ratio.values()) if isinstance(ratio, dict) and ratio else ratio
    ratio = f"{ratio:.3g}" if isinstance(ratio, float) else "-"
    why = s.get("error") or s.get("note") or ""
    print(f"  {s['step']:<12} {s['status']:<8} {s['seconds']:>7.3f}s  err/bound={ratio}  {why[:90]}")
PY
    else
        echo "no smoke.json (see logs/smoke.log in suite.tar.gz)"
    fi
    echo
    echo "--- pytest ---"
    [[ -f "$WORK/logs/pytest.log" ]] && grep -E '^(FAILED|ERROR)|passed|failed' "$WORK/logs/pytest.log" | tail -n 25
    echo
    echo "--- bench (perf) ---"
    if [[ -f "$WORK/bench/bench.json" ]]; then
        python3 - "$WORK/bench/bench.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
m, c = doc["metadata"], doc["ceilings"]
print(f"{m.get('gpu_name')} driver {m.get('driver')} torch {m['versions'].get('torch')} "
      f"triton {m['versions'].get('triton')} jax {m['versions'].get('jax')} commit {str(m.get('commit'))[:10]}")
cp, mm = c.get("copy", {}), c.get("matmul", {})
print(f"ceilings: copy {cp.get('gbps', 0):.0f} GB/s, matmul {mm.get('tflops', 0):.0f} TFLOP/s")
f = lambda v, s: format(v, s) if isinstance(v, (int, float)) else "-"
for r in doc["results"]:
    head = f"{r['op'][:10]:<10} {r['shape'][:34]:<34} {r['impl'][:26]:<26}"
    if r["status"] != "ok":
        print(f"{head} {r['status']}: {(r.get('reason') or '')[:70]}")
    else:
        print(f"{head} {f(r['median_ms'], '8.3f')}ms {f(r.get('gbps'), '7.0f')}GB/s "
              f"{f(r.get('tflops'), '6.1f')}TF x{f(r.get('speedup_vs_vendor'), '.2f')} vs vendor")
for r in doc["overhead"]:
    us = f(r.get("host_us_per_call"), "8.1f")
    print(f"overhead {r['binding'][:40]:<40} {r['status']:<7} {us}us {r.get('implementation_ran') or r.get('reason', '')[:50]}")
PY
    else
        echo "no bench.json (see logs/bench.log in suite.tar.gz)"
        tail -n 15 "$WORK/logs/bench.log" 2>/dev/null
    fi
} >"$WORK/summary.txt" 2>&1

cp "$WORK/summary.txt" "$OUT/summary.txt"
[[ -f "$WORK/logs/pytest.log" ]] && cat "$WORK/versions.txt" "$WORK/logs/pytest.log" >"$OUT/pytest.log"
for f in bench.csv bench.json bench.png; do
    [[ -f "$WORK/bench/$f" ]] && cp "$WORK/bench/$f" "$OUT/$f"
done
for f in backends.json doctor.json; do
    [[ -s "$WORK/$f" ]] && cp "$WORK/$f" "$OUT/$f"
done
tar -czf "$OUT/suite.tar.gz" -C "$WORK" .
rm -rf "$WORK"
cat "$OUT/summary.txt"
