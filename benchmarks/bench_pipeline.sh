#!/usr/bin/env bash
# Pipeline parallelism against data parallelism and one rank, on a model deep enough to split:
#
#   benchmarks/bench_pipeline.sh STRATA DATA.h5 [REPEATS]
#
# The MLP 784-1024x8-10 (8 hidden Linear(1024)+ReLU layers, 8.2 M parameters), global batch 256,
# SGD, 30 steps, three configurations on this machine's cores:
#   1rank  1 rank, --threads 2 (both cores in one process)
#   dp2    2 ranks x --threads 1, data parallel (D=2, 128 samples per replica)
#   pp2    2 ranks x --threads 1, --parallel.pipeline_stages 2 --parallel.microbatches 8
#          --parallel.schedule 1f1b (P=2, micro-batches of 32)
# reporting samples_per_s of the done event (the training loop's wall time: no start-up, no
# evaluation) as the median over REPEATS (default 3), and the ratios pp2/1rank and pp2/dp2
# (of the medians, and the median of the per-repeat ratios). The three run one after the other
# in each repeat, in an order that rotates between repeats, so a drift in the machine's speed
# hits all of them. Runs use a train-only copy of the first 8192 samples of DATA (no test-set
# evaluation at the end of each run; the timed loop is the same). The idle share of the P=2
# stages (stage_idle_share) is printed beside it: the bubble and the imbalance of the stages.
#
# Environment: BENCH_STEPS=30, BENCH_PYTHON=/usr/bin/python3, BENCH_MPIRUN_ARGS (extra mpirun
# flags).
set -euo pipefail

STRATA=${1:?usage: bench_pipeline.sh STRATA DATA.h5 [REPEATS]}
DATA=${2:?usage: bench_pipeline.sh STRATA DATA.h5 [REPEATS]}
REPEATS=${3:-3}
STEPS=${BENCH_STEPS:-30}
PY=${BENCH_PYTHON:-/usr/bin/python3}
read -r -a MPIRUN_ARGS <<<"${BENCH_MPIRUN_ARGS:-}"
BATCH=256
HIDDEN=(1024 1024 1024 1024 1024 1024 1024 1024)

die() { echo "bench_pipeline.sh: error: $*" >&2; exit 2; }
[[ -x $STRATA ]] || die "$STRATA is not an executable"
[[ -f $DATA ]] || die "$DATA not found (strata prepare fashion-mnist --out $DATA)"
[[ $REPEATS =~ ^[1-9][0-9]*$ ]] || die "REPEATS=$REPEATS is not a positive integer"
[[ $STEPS =~ ^[1-9][0-9]*$ ]] || die "BENCH_STEPS=$STEPS is not a positive integer"
if (( $(id -u) == 0 )); then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/strata-bench-pipeline.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
BIN="$WORK/strata"  # a private copy: a rebuild during the benchmark must not mix two binaries
cp "$STRATA" "$BIN"
"$PY" - "$DATA" "$WORK/train-only.h5" <<'EOF'
import sys, h5py
with h5py.File(sys.argv[1], "r") as src, h5py.File(sys.argv[2], "w") as dst:
    n = min(8192, src["train/images"].shape[0])
    dst["train/images"] = src["train/images"][:n]
    dst["train/labels"] = src["train/labels"][:n]
    if "classes" in src.attrs:
        dst.attrs["classes"] = src.attrs["classes"]
EOF

# json_get KEY: one JSON object on stdin -> its KEY (lists as space-separated values).
json_get() {
  "$PY" -c 'import json,sys
v = json.loads(sys.stdin.read())[sys.argv[1]]
print(" ".join(f"{x:.3f}" if isinstance(x, float) else str(x) for x in v) if isinstance(v, list) else v)' "$1"
}
median() { "$PY" -c 'import statistics,sys; print(statistics.median(float(v) for v in sys.argv[1:]))' "$@"; }
calc() { "$PY" -c "print($1)"; }

# run CONFIG OUTDIR: one training run; prints the done line of its metrics.jsonl.
run() {
  local config=$1 out=$2 launch=() flags=()
  case $config in
    1rank) flags=(--threads 2) ;;
    dp2)   launch=(mpirun -n 2 --bind-to none "${MPIRUN_ARGS[@]}"); flags=(--threads 1) ;;
    pp2)   launch=(mpirun -n 2 --bind-to none "${MPIRUN_ARGS[@]}")
           flags=(--threads 1 --parallel.pipeline_stages 2 --parallel.microbatches 8
                  --parallel.schedule 1f1b) ;;
  esac
  if [[ ${#launch[@]} -gt 0 ]] && (( $(nproc) < 2 )); then launch+=(--oversubscribe); fi
  rm -rf "$out"; mkdir -p "$out"
  if ! "${launch[@]}" "$BIN" train --data.path "$WORK/train-only.h5" --model.type mlp \
        --model.hidden "${HIDDEN[@]}" --train.batch_size "$BATCH" --train.max_steps "$STEPS" \
        --train.log_every "$STEPS" --train.seed 1 --output.dir "$out" --quiet "${flags[@]}" \
        >"$out.log" 2>&1; then
    tail -n 20 "$out.log" >&2
    die "$config run failed (log above)"
  fi
  grep '"event": "done"' "$out/metrics.jsonl" | tail -n 1
}

CONFIGS=(1rank dp2 pp2)
declare -A SPS
IDLE=()
echo "== pipeline vs data parallel vs one rank, $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "machine: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg); strata $STRATA"
echo "model: MLP 784-$(IFS=-; echo "${HIDDEN[*]}")-10, global batch $BATCH, $STEPS steps, SGD; median of $REPEATS"
echo "  1rank: 1 rank x 2 threads | dp2: 2 ranks x 1 thread (D=2) | pp2: 2 ranks x 1 thread (P=2, M=8, 1f1b)"
for ((r = 0; r < REPEATS; r++)); do
  for ((i = 0; i < 3; i++)); do
    c=${CONFIGS[(i + r) % 3]}
    res=$(run "$c" "$WORK/$c-$r")
    sps=$(json_get samples_per_s <<<"$res")
    SPS[$c]="${SPS[$c]:-} $sps"
    extra=""
    if [[ $c == pp2 ]]; then
      idle=$(json_get stage_idle_share <<<"$res")
      IDLE+=("$idle")
      extra="  stage idle share $idle  peak live micro-batches $(json_get peak_live_microbatches <<<"$res")"
    fi
    printf '  repeat %d/%d  %-5s %8.0f samples/s%s\n' $((r + 1)) "$REPEATS" "$c" "$sps" "$extra"
  done
done

declare -A MED
for c in "${CONFIGS[@]}"; do
  read -r -a v <<<"${SPS[$c]}"
  MED[$c]=$(median "${v[@]}")
done
read -r -a v1 <<<"${SPS[1rank]}"; read -r -a vd <<<"${SPS[dp2]}"; read -r -a vp <<<"${SPS[pp2]}"
pr1=() prd=()
for ((r = 0; r < REPEATS; r++)); do
  pr1+=("$(calc "${vp[r]} / ${v1[r]}")"); prd+=("$(calc "${vp[r]} / ${vd[r]}")")
done
echo
printf '%-34s %10s\n' configuration "samples/s"
printf '%-34s %10.0f\n' "1 rank x 2 threads" "${MED[1rank]}" "D=2: 2 ranks x 1 thread" "${MED[dp2]}" \
  "P=2: 2 ranks x 1 thread, M=8 1f1b" "${MED[pp2]}"
printf 'P=2 / 1 rank: %.2fx (per-repeat median %.2fx)   P=2 / D=2: %.2fx (per-repeat median %.2fx)\n' \
  "$(calc "${MED[pp2]} / ${MED[1rank]}")" "$(median "${pr1[@]}")" \
  "$(calc "${MED[pp2]} / ${MED[dp2]}")" "$(median "${prd[@]}")"
echo "P=2 stage idle share per run: $(printf '[%s] ' "${IDLE[@]}")"
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
