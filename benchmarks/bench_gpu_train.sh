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
#   BENCH_GPT=1 (0 skips it)   BENCH_GPT_BATCH=8   BENCH_GPT_STEPS=50   BENCH_PEAK_TFLOPS (else
#   from the GPU's name: H100/H200 SXM 989 dense bf16, 67 fp32 non-tensor)   BENCH_GPT_TEXT
#   (one text file; default: the repository's sources and docs)
# Needs bash and awk (no Python: it runs from the bundle's GPU check too, with configs/ beside
# it).
# Then a GPT-2 124M-shaped model (12 layers, 12 heads, dim 768, context 1024; byte-level
# vocabulary 256 instead of GPT-2's 50257, so the embedding and head are ~1% of the FLOPs instead
# of ~30%) in bf16 and fp32 on one GPU: tokens/s and MFU = tokens/s x (6 N + 12 L C T) FLOP per
# token / peak (PaLM's training-FLOP count: N parameters, L layers, C dim, T context). No CPU
# figure beside it: one CPU step of this model takes minutes. Text: the repository's own
# sources and docs as bytes, or BENCH_GPT_TEXT (the content does not change the speed).
# Exits 0 after one line when this machine has no GPU (nothing to compare).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

STRATA_BIN=${STRATA_BIN:-./build/strata}
DATA=${BENCH_DATA:-data/fashion-mnist.h5}
REPEATS=${BENCH_REPEATS:-3}
MODELS=${BENCH_MODELS-mlp cnn}  # set but empty: the GPT table only
STEPS=${BENCH_STEPS:-300}
BATCH=${BENCH_BATCH:-256}
CPU_THREADS=${BENCH_CPU_THREADS:-$(nproc)}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

[ -x "$STRATA_BIN" ] || { echo "bench_gpu_train.sh: error: no $STRATA_BIN (build first)" >&2; exit 2; }
[ -s "$DATA" ] || { echo "bench_gpu_train.sh: error: no $DATA (strata prepare fashion-mnist --out $DATA)" >&2; exit 2; }

# samples/s of one run: strata's metrics `done` event.
done_rate() {
  awk '/"event": "done"/ && match($0, /"samples_per_s": [^,}]+/) {
         print substr($0, RSTART + 17, RLENGTH - 17) }' "$1/metrics.jsonl"
}
run() {  # model device precision threads
  local dir=$OUT/$1-$2-$3
  rm -rf "$dir"
  "$STRATA_BIN" train --config "configs/fmnist_$1.toml" --data.path "$DATA" --quiet \
    --device "$2" --train.precision "$3" --threads "$4" --train.batch_size "$BATCH" \
    --train.max_steps "$STEPS" --output.dir "$dir" >/dev/null
  done_rate "$dir"
}
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

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
  printf '%-5s %-16s %14.0f %10s\n' "$m" "gpu fp32" "$gm" "$(ratio "$gm" "$cm")"
  printf '%-5s %-16s %14.0f %10s\n' "$m" "gpu bf16" "$bm" "$(ratio "$bm" "$cm")"
done

# ---- GPT-2 124M shape ----------------------------------------------------------------------
[ "${BENCH_GPT:-1}" = 1 ] || exit 0
GPT_BATCH=${BENCH_GPT_BATCH:-8}
GPT_STEPS=${BENCH_GPT_STEPS:-50}
L=12 H=12 C=768 T=1024 V=256
# The text: BENCH_GPT_TEXT (one file), else the repository's sources and docs.
if [ -n "${BENCH_GPT_TEXT:-}" ]; then
  texts=("$BENCH_GPT_TEXT")
else
  mapfile -t texts < <(find README.md benchmarks include src kernels -type f \( -name '*.md' -o -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) | sort)
fi
"$STRATA_BIN" prepare text --input "${texts[@]}" --out "$OUT/text.h5" >/dev/null
peak=${BENCH_PEAK_TFLOPS:-}
name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1 || true)
gpt_run() {  # precision -> tokens/s
  local dir=$OUT/gpt-$1
  rm -rf "$dir"
  "$STRATA_BIN" train --data.path "$OUT/text.h5" --quiet --device cuda --train.precision "$1" \
    --model.type gpt --model.layers $L --model.heads $H --model.dim $C --model.context $T \
    --model.dropout 0 --train.optimizer adamw --train.lr 3e-4 --train.batch_size "$GPT_BATCH" \
    --train.max_steps "$GPT_STEPS" --output.dir "$dir" >/dev/null
  awk -v t=$T '{ print $1 * t }' <<<"$(done_rate "$dir")"
}
echo
echo "GPT-2 124M shape (L $L, heads $H, dim $C, context $T, vocab $V), batch $GPT_BATCH, $GPT_STEPS steps, median of $REPEATS"
printf '%-5s %14s %12s %8s\n' prec tokens/s "peak TFLOP/s" MFU
for prec in bf16 fp32; do
  declare -a r=()
  for _ in $(seq "$REPEATS"); do r+=("$(gpt_run $prec)"); done
  tps=$(median "${r[@]}")
  p=$peak
  if [ -z "$p" ]; then
    case "$name" in *H100*|*H200*) p=$([ $prec = bf16 ] && echo 989 || echo 67) ;; *) p="" ;; esac
  fi
  # N parameters of the GPT (12 C^2 + 13 C per block, the embeddings, the final LayerNorm);
  # training FLOP per token 6 N + 12 L C T.
  awk -v L=$L -v C=$C -v T=$T -v V=$V -v tps="$tps" -v prec=$prec -v peak="$p" 'BEGIN {
    N = L * (12 * C * C + 13 * C) + V * C + T * C + 2 * C
    flops = 6 * N + 12 * L * C * T
    mfu = peak != "" ? sprintf("%.3f", tps * flops / (peak * 1e12)) : "-"
    printf "%-5s %14.0f %12s %8s\n", prec, tps, peak != "" ? peak : "?", mfu }'
done
