#!/usr/bin/env bash
# GPU training throughput beside the CPU path, in the same run: the MLP and CNN configs on one
# GPU (fp32 and bf16) and on one CPU rank, samples/s from strata's own `done` line (training
# loop only), the median of BENCH_REPEATS runs each, and the GPU/CPU ratio. See
# benchmarks/README.md; record GPU figures in benchmarks/RESULTS.md with device and date.
#
#   benchmarks/bench_gpu_train.sh
# Environment:
#   BENCH_REPEATS=3   BENCH_MODELS="mlp cnn"   BENCH_STEPS=300 (per run; the first 10% warm up
#   the GPU too, and are in the figure: strata reports the whole loop)   BENCH_BATCH=256
#   BENCH_CPU_THREADS=$(nproc)   STRATA_BIN=./build/strata   BENCH_DATA=data/fashion-mnist.h5
# Exits 0 after one line when this machine has no GPU (nothing to compare).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

STRATA_BIN=${STRATA_BIN:-./build/strata}
DATA=${BENCH_DATA:-data/fashion-mnist.h5}
REPEATS=${BENCH_REPEATS:-3}
MODELS=${BENCH_MODELS:-mlp cnn}
STEPS=${BENCH_STEPS:-300}
BATCH=${BENCH_BATCH:-256}
CPU_THREADS=${BENCH_CPU_THREADS:-$(nproc)}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

[ -x "$STRATA_BIN" ] || { echo "bench_gpu_train.sh: error: no $STRATA_BIN (build first)" >&2; exit 2; }
[ -s "$DATA" ] || { echo "bench_gpu_train.sh: error: no $DATA (strata prepare fashion-mnist --out $DATA)" >&2; exit 2; }

# samples/s of one run: strata's metrics `done` event.
run() {  # model device precision threads
  local dir=$OUT/$1-$2-$3
  rm -rf "$dir"
  "$STRATA_BIN" train --config "configs/fmnist_$1.toml" --data.path "$DATA" --quiet \
    --device "$2" --train.precision "$3" --threads "$4" --train.batch_size "$BATCH" \
    --train.max_steps "$STEPS" --output.dir "$dir" >/dev/null
  python3 -c 'import json,sys
for l in open(sys.argv[1]):
    m = json.loads(l)
    if m.get("event") == "done": print(m["samples_per_s"])' "$dir/metrics.jsonl"
}
median() { python3 -c 'import statistics,sys; print(statistics.median(float(v) for v in sys.argv[1:]))' "$@"; }

if ! probe=$("$STRATA_BIN" train --config configs/fmnist_mlp.toml --data.path "$DATA" --quiet \
     --device cuda --train.max_steps 1 --output.dir "$OUT/probe" 2>&1 >/dev/null); then
  echo "bench_gpu_train.sh: no GPU here: ${probe##*: error: }; nothing measured"
  exit 0
fi
echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n1)"
echo "date: $(date -u '+%F %H:%M UTC'); batch $BATCH, $STEPS steps per run, median of $REPEATS"
printf '%-5s %-16s %14s %10s\n' model path samples/s "vs CPU"
for m in $MODELS; do
  declare -a c=() g=() b=()
  for _ in $(seq "$REPEATS"); do
    c+=("$(run "$m" cpu fp32 "$CPU_THREADS")")
    g+=("$(run "$m" cuda fp32 1)")
    b+=("$(run "$m" cuda bf16 1)")
  done
  cm=$(median "${c[@]}") gm=$(median "${g[@]}") bm=$(median "${b[@]}")
  printf '%-5s %-16s %14.0f %10s\n' "$m" "cpu x$CPU_THREADS fp32" "$cm" "1.00"
  printf '%-5s %-16s %14.0f %10.2f\n' "$m" "gpu fp32" "$gm" "$(python3 -c "print($gm/$cm)")"
  printf '%-5s %-16s %14.0f %10.2f\n' "$m" "gpu bf16" "$bm" "$(python3 -c "print($bm/$cm)")"
done
