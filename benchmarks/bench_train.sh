#!/usr/bin/env bash
# Training-speed benchmark: strata against PyTorch on the identical network and optimizer,
# then strata's data-parallel scaling at 2 ranks. See benchmarks/README.md.
#
#   benchmarks/bench_train.sh                  # everything (MLP and CNN, full epochs)
#   BENCH_MODELS=mlp benchmarks/bench_train.sh # the MLP only
#   BENCH_CNN_STEPS=200 benchmarks/bench_train.sh
#
# Environment:
#   BENCH_REPEATS=3      timed runs per framework and model (the median is reported)
#   BENCH_MODELS="mlp cnn"
#   BENCH_CNN_STEPS=0    CNN: stop after N steps in BOTH frameworks (0 = one full epoch); then
#                        one untimed full epoch per framework checks the accuracy first
#   BENCH_COMPARE=1      0 skips the comparison with PyTorch (parts 1 and 2)
#   BENCH_SCALING=1      0 skips the 2-rank part
#   BENCH_SCALING_REPEATS=$BENCH_REPEATS
#   BENCH_BUCKET_MB=     strata --dp.bucket_mb for the 2-rank runs (empty = strata's default)
#   BENCH_MPIRUN_ARGS=  extra mpirun flags for the 2-rank runs (e.g. "--bind-to none")
#   BENCH_STRICT=0       1: exit 1 when a speed target is missed (accuracy failures always exit 1)
#   BENCH_BASELINE_STRATA=PATH  another strata build in PyTorch's place (parts 1 and 2, the same
#                        alternating runs): a refactoring's "not slower" check, target 0.98
#   STRATA_BIN=./build/strata   BENCH_DATA=data/fashion-mnist.h5   BENCH_PYTHON=/usr/bin/python3
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."  # the repository root

STRATA_BIN=${STRATA_BIN:-./build/strata}
DATA=${BENCH_DATA:-data/fashion-mnist.h5}
PY=${BENCH_PYTHON:-/usr/bin/python3}
REPEATS=${BENCH_REPEATS:-3}
MODELS=${BENCH_MODELS:-mlp cnn}
CNN_STEPS=${BENCH_CNN_STEPS:-0}
COMPARE=${BENCH_COMPARE:-1}
SCALING=${BENCH_SCALING:-1}
SCALING_REPEATS=${BENCH_SCALING_REPEATS:-$REPEATS}
BUCKET_MB=${BENCH_BUCKET_MB:-}
STRICT=${BENCH_STRICT:-0}
read -r -a MPIRUN_ARGS <<<"${BENCH_MPIRUN_ARGS:-}"

# The identical training setup for both frameworks: batch 64, one epoch, SGD momentum 0.9,
# constant lr 0.05, weight decay 1e-4 (strata's configs use cosine + warmup: overridden here).
BATCH=64 LR=0.05 MOMENTUM=0.9 WD=0.0001 SEED=1

declare -A TARGET=([mlp]=1.7 [cnn]=1.5)    # strata samples/s ÷ PyTorch samples/s, at least
BASELINE=${BENCH_BASELINE_STRATA:-}
OTHER=pytorch
if [[ -n $BASELINE ]]; then OTHER=baseline; TARGET=([mlp]=0.98 [cnn]=0.98); fi
declare -A MIN_ACC=([mlp]=0.80 [cnn]=0.85)  # test accuracy after one epoch, more than

# ---------------------------------------------------------------------------------------------
die() { echo "bench_train.sh: error: $*" >&2; exit 2; }
note() { echo "bench_train.sh: $*" >&2; }

# json_get KEY: reads one JSON object on stdin, prints its KEY.
json_get() { "$PY" -c 'import json,sys; print(json.loads(sys.stdin.read())[sys.argv[1]])' "$1"; }

# median V...: the median of the numbers given.
median() { "$PY" -c 'import statistics,sys; print(statistics.median(float(v) for v in sys.argv[1:]))' "$@"; }

# calc EXPR: evaluates a Python arithmetic expression.
calc() { "$PY" -c "print($1)"; }


# busy_percent: how busy all CPUs were over the next 3 seconds, in percent (/proc/stat).
busy_percent() {
  local a b
  a=$(head -n 1 /proc/stat); sleep 3; b=$(head -n 1 /proc/stat)
  "$PY" -c 'import sys
a = [int(v) for v in sys.argv[1].split()[1:9]]; b = [int(v) for v in sys.argv[2].split()[1:9]]
d = [y - x for x, y in zip(a, b)]; idle = d[3] + d[4]
print(round(100 * (1 - idle / max(sum(d), 1))))' "$a" "$b"
}

# steps_for MODEL: the step cap for MODEL (0 = the full epoch).
steps_for() { if [[ $1 == cnn ]]; then echo "$CNN_STEPS"; else echo 0; fi; }

# torch_env CMD...: runs CMD with PyTorch's BLAS on one thread (torch.set_num_threads does not
# reach the pool of Debian's openblas-pthread, which otherwise runs one thread per core). The
# fast kernels (OPENBLAS_CORETYPE) torch_baseline.py picks itself, before it imports torch.
torch_env() { OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 "$@"; }

# run_strata MODEL RANKS OUTDIR [extra strata flags...]: one training run; prints the final
# "done" line of its metrics.jsonl (rank 0's view).
run_strata() {
  local model=$1 ranks=$2 out=$3; shift 3
  local steps; steps=$(steps_for "$model")
  local args=(train --config "configs/fmnist_${model}.toml" --data.path "$DATA"
              --train.epochs 1 --train.batch_size "$BATCH" --train.max_steps "$steps"
              --train.lr "$LR" --train.momentum "$MOMENTUM" --train.weight_decay "$WD"
              --train.lr_schedule constant --train.warmup_steps 0 --train.seed "$SEED"
              --threads 1 --output.dir "$out" --quiet "$@")
  local launch=()
  if (( ranks > 1 )); then
    launch=(mpirun -n "$ranks" "${MPIRUN_ARGS[@]}")
    (( $(nproc) < ranks )) && launch+=(--oversubscribe)
  fi
  rm -rf "$out"; mkdir -p "$out"
  if ! "${launch[@]}" "$BIN" "${args[@]}" >"$out.log" 2>&1; then
    tail -n 20 "$out.log" >&2
    die "strata ($model, $ranks rank(s)) failed; command: ${launch[*]} $BIN ${args[*]}"
  fi
  grep '"event": "done"' "$out/metrics.jsonl" | tail -n 1
}

# run_torch MODEL [STEPS]: one PyTorch training run; prints its JSON line.
run_torch() {
  local model=$1 steps=${2:-$(steps_for "$1")}
  local log="$WORK/torch.log"
  if ! torch_env "$PY" benchmarks/torch_baseline.py --model "$model" \
        --data "$DATA" --batch-size "$BATCH" --epochs 1 --max-steps "$steps" --lr "$LR" \
        --momentum "$MOMENTUM" --weight-decay "$WD" --threads 1 --seed "$SEED" \
        --quiet-config 2>"$log" | tail -n 1; then
    cat "$log" >&2
    die "torch_baseline.py ($model) failed"
  fi
}

# run_other MODEL [STEPS] [RUN]: the baseline's run: PyTorch, or the other strata build.
run_other() {
  if [[ -n $BASELINE ]]; then BIN=$BASE_BIN run_strata "$1" 1 "$WORK/${1}_baseline_${3:-0}"
  else run_torch "$1" "${2:-$(steps_for "$1")}"; fi
}

# check_accuracy WHO MODEL JSON: a benchmark that trains garbage fast must fail.
check_accuracy() {
  local who=$1 model=$2 acc; acc=$(json_get test_accuracy <<<"$3")
  if [[ $(calc "$acc > ${MIN_ACC[$model]}") != True ]]; then
    echo "FAIL: $who $model test accuracy $acc after one epoch (must be > ${MIN_ACC[$model]})" >&2
    exit 1
  fi
  echo "$acc"
}

# ---------------------------------------------------------------------------------------------
# Part 1 and 2: strata against PyTorch, one rank, one thread.

# compare_model MODEL: the accuracy gate and the alternating timed runs; sets S_SPS and T_SPS.
compare_model() {
  local model=$1 steps r who res sps acc s_list=() t_list=()
  steps=$(steps_for "$model")
  if (( steps > 0 )); then  # capped runs cannot show the accuracy: one untimed full epoch each
    echo "[$model] accuracy check (one full epoch per framework, untimed)"
    acc=$(check_accuracy strata "$model" "$(CNN_STEPS=0 run_strata "$model" 1 "$WORK/${model}_check")")
    echo "  strata  test accuracy $acc"
    acc=$(check_accuracy "$OTHER" "$model" "$(CNN_STEPS=0 run_other "$model" 0)")
    echo "  $OTHER test accuracy $acc"
  fi
  for ((r = 1; r <= REPEATS; r++)); do
    # alternate which framework goes first, so a drift in machine speed affects both alike
    for who in $( ((r % 2)) && echo "strata $OTHER" || echo "$OTHER strata"); do
      if [[ $who == strata ]]; then res=$(run_strata "$model" 1 "$WORK/${model}_1r_$r")
      else res=$(run_other "$model" "" "$r"); fi
      sps=$(json_get samples_per_s <<<"$res")
      if (( steps > 0 )); then acc=$(json_get test_accuracy <<<"$res")
      else acc=$(check_accuracy "$who" "$model" "$res"); fi
      printf '[%s] run %d/%d  %-7s %8.0f samples/s  %6.2f s  test accuracy %s\n' "$model" "$r" \
        "$REPEATS" "$who" "$sps" "$(json_get train_time_s <<<"$res")" "$acc"
      if [[ $who == strata ]]; then s_list+=("$sps"); else t_list+=("$sps"); fi
    done
  done
  S_SPS[$model]=$(median "${s_list[@]}")
  T_SPS[$model]=$(median "${t_list[@]}")
  # Each repeat's two runs sit side by side in time, so their ratio cancels the machine's
  # drift between repeats; the median of those ratios is the second figure of the table.
  local pair=()
  for ((r = 0; r < REPEATS; r++)); do pair+=("$(calc "${s_list[r]} / ${t_list[r]}")"); done
  P_RATIO[$model]=$(median "${pair[@]}")
}

# print_comparison: the table of part 1; sets ANY_FAIL when a target is missed.
print_comparison() {
  local model ratio res label
  echo
  echo "== one rank, one thread, batch $BATCH (median of $REPEATS)"
  printf '%-6s %16s %17s %7s %7s %7s %7s\n' model "strata samples/s" "$OTHER samples/s" ratio paired target result
  for model in $MODELS; do
    ratio=$(calc "${S_SPS[$model]} / ${T_SPS[$model]}")
    # PASS needs both: the ratio of the medians and the median of the per-repeat ratios.
    if [[ $(calc "min($ratio, ${P_RATIO[$model]}) >= ${TARGET[$model]}") == True ]]; then res=PASS
    else res=FAIL; ANY_FAIL=1; fi
    label=$model
    if (( $(steps_for "$model") > 0 )); then label="$model*"; fi
    printf '%-6s %16.0f %17.0f %6.2fx %6.2fx %6.1fx %7s\n' "$label" "${S_SPS[$model]}" "${T_SPS[$model]}" \
      "$ratio" "${P_RATIO[$model]}" "${TARGET[$model]}" "$res"
  done
  if (( CNN_STEPS > 0 )) && [[ " $MODELS " == *" cnn "* ]]; then
    echo "* $CNN_STEPS steps, not a full epoch"
  fi
}

# ---------------------------------------------------------------------------------------------
# Part 3: 2 ranks x 1 thread, overlap on and off.

# scaling_model MODEL: alternating runs with overlap on and off; sets SC_*, EX_*, TT_*.
scaling_model() {
  local model=$1 r ov res sps ex t buckets bucket_args=()
  local on_sps=() off_sps=() on_ex=() off_ex=() on_t=() off_t=()
  [[ -n $BUCKET_MB ]] && bucket_args=(--dp.bucket_mb "$BUCKET_MB")
  for ((r = 1; r <= SCALING_REPEATS; r++)); do
    for ov in true false; do
      res=$(run_strata "$model" 2 "$WORK/${model}_2r_${ov}_$r" --dp.overlap "$ov" "${bucket_args[@]}")
      sps=$(json_get samples_per_s <<<"$res")
      ex=$(json_get allreduce_exposed_s <<<"$res")
      t=$(json_get train_time_s <<<"$res")
      if (( $(steps_for "$model") == 0 )); then check_accuracy strata-2-ranks "$model" "$res" >/dev/null; fi
      buckets=$(grep -o '[0-9]* allreduce buckets\?' "$WORK/${model}_2r_${ov}_$r.log" || echo '? buckets')
      printf '[%s] run %d/%d  overlap %-5s %8.0f samples/s  allreduce exposed %.3f s of %.2f s  (%s)\n' \
        "$model" "$r" "$SCALING_REPEATS" "$ov" "$sps" "$ex" "$t" "$buckets"
      if [[ $ov == true ]]; then on_sps+=("$sps"); on_ex+=("$ex"); on_t+=("$t")
      else off_sps+=("$sps"); off_ex+=("$ex"); off_t+=("$t"); fi
    done
  done
  SC_ON[$model]=$(median "${on_sps[@]}"); SC_OFF[$model]=$(median "${off_sps[@]}")
  EX_ON[$model]=$(median "${on_ex[@]}"); EX_OFF[$model]=$(median "${off_ex[@]}")
  TT_ON[$model]=$(median "${on_t[@]}"); TT_OFF[$model]=$(median "${off_t[@]}")
}

print_scaling() {
  local model hidden saved vs1
  echo
  echo "hidden share of the allreduce = 1 - exposed_on / exposed_off"
  echo "  exposed_on:  rank 0's training-thread time in allreduce calls (starting and testing"
  echo "               buckets during backward, waiting for them after it), overlap on"
  echo "  exposed_off: the same with --dp.overlap false, i.e. the whole blocking allreduce"
  echo "cross-check from wall time: saved share = (train_time_off - train_time_on) / exposed_off"
  echo "  (the saved share carries the run-to-run noise of the whole epoch)"
  printf '%-6s %14s %15s %10s %12s %13s %7s %7s\n' model "overlap on s/s" "overlap off s/s" \
    "vs 1 rank" "exposed on s" "exposed off s" hidden saved
  for model in $MODELS; do
    hidden=$(calc "100 * (1 - ${EX_ON[$model]} / ${EX_OFF[$model]}) if ${EX_OFF[$model]} > 0 else 'nan'")
    saved=$(calc "100 * (${TT_OFF[$model]} - ${TT_ON[$model]}) / ${EX_OFF[$model]} if ${EX_OFF[$model]} > 0 else 'nan'")
    vs1=$(calc "${SC_ON[$model]} / ${S_SPS[$model]:-nan}" 2>/dev/null || echo nan)
    printf '%-6s %14.0f %15.0f %9.2fx %12.3f %13.3f %6.1f%% %6.1f%%\n' "$model" "${SC_ON[$model]}" \
      "${SC_OFF[$model]}" "$vs1" "${EX_ON[$model]}" "${EX_OFF[$model]}" "$hidden" "$saved"
  done
}

# ---------------------------------------------------------------------------------------------
[[ -x $STRATA_BIN ]] || die "$STRATA_BIN not found; build it first:
  mkdir -p build && cd build && cmake .. && make -j\$(nproc) strata"
[[ -x $PY ]] || die "$PY not found (PyTorch comes from Debian: apt-get install python3-torch python3-h5py)"
"$PY" -c 'import torch, h5py' 2>/dev/null \
  || die "$PY cannot import torch and h5py (apt-get install python3-torch python3-h5py)"
[[ $REPEATS =~ ^[1-9][0-9]*$ ]] || die "BENCH_REPEATS=$REPEATS is not a positive integer"
[[ $SCALING_REPEATS =~ ^[1-9][0-9]*$ ]] || die "BENCH_SCALING_REPEATS=$SCALING_REPEATS is not a positive integer"
[[ $CNN_STEPS =~ ^[0-9]+$ ]] || die "BENCH_CNN_STEPS=$CNN_STEPS is not a number"
for m in $MODELS; do [[ -n ${TARGET[$m]:-} ]] || die "BENCH_MODELS: unknown model '$m' (mlp | cnn)"; done
if (( $(id -u) == 0 )); then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/strata-bench.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
# A private copy of the binary: a rebuild during the benchmark must not mix two versions.
BIN="$WORK/strata"
cp "$STRATA_BIN" "$BIN"
if [[ -n $BASELINE ]]; then
  [[ -x $BASELINE ]] || die "BENCH_BASELINE_STRATA=$BASELINE is not an executable"
  BASE_BIN="$WORK/strata-baseline"
  cp "$BASELINE" "$BASE_BIN"
fi

if [[ ! -f $DATA ]]; then
  note "$DATA missing: preparing it"
  mkdir -p "$(dirname "$DATA")"
  "$BIN" prepare fashion-mnist --out "$DATA"
fi
cat "$DATA" >/dev/null  # into the page cache, so the first timed run does not pay the disk

echo "== strata training benchmark, $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs; load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "strata:  $("$BIN" --version 2>/dev/null | head -n 1 || true); $STRATA_BIN built $(date -u -r "$STRATA_BIN" '+%Y-%m-%d %H:%M:%S UTC'); tree $(git describe --always --dirty 2>/dev/null || echo '?')"
if [[ -n $BASELINE ]]; then
  echo "baseline: $("$BASE_BIN" --version 2>/dev/null | head -n 1 || true) ($BASELINE), in PyTorch's place"
else
  echo "pytorch: OPENBLAS_NUM_THREADS=1; backends:"
  torch_env "$PY" benchmarks/torch_baseline.py --model mlp --data "$DATA" \
    --max-steps 1 2>&1 >/dev/null | sed 's/^/  /'
fi
echo "setup:   1 rank, 1 thread, global batch $BATCH, one epoch, SGD momentum $MOMENTUM, lr $LR constant, weight decay $WD; $REPEATS runs each, alternating, median"
if (( CNN_STEPS > 0 )); then
  echo "         CNN limited to $CNN_STEPS steps in both frameworks (BENCH_CNN_STEPS)"
fi
busy=$(busy_percent)
if (( busy > 10 )); then
  echo "warning: the CPUs were ${busy}% busy in the 3 s before the first run: other work on this machine distorts the figures"
fi
echo

# ---------------------------------------------------------------------------------------------
declare -A S_SPS T_SPS P_RATIO SC_ON SC_OFF EX_ON EX_OFF TT_ON TT_OFF
ANY_FAIL=0

if [[ $COMPARE == 1 ]]; then
  for model in $MODELS; do compare_model "$model"; done
  print_comparison
fi

if [[ $SCALING == 1 ]]; then
  echo
  echo "== scaling: 2 ranks x 1 thread, global batch $BATCH ($((BATCH / 2)) per rank), bucket ${BUCKET_MB:-default} MiB; median of $SCALING_REPEATS"
  echo "   mpirun -n 2 ${MPIRUN_ARGS[*]}"
  for model in $MODELS; do scaling_model "$model"; done
  print_scaling
fi

if (( ANY_FAIL )); then
  echo
  echo "FAIL: strata is below its speed target for at least one model (see the table above)"
  if [[ $STRICT == 1 ]]; then exit 1; fi
  echo "(BENCH_STRICT=1 makes this exit 1)"
fi
exit 0
