#!/usr/bin/env bash
# Where the step cost of memory checkpoints written by the optimizer's update goes (issue 33),
# on one rank of the MLP. Prints a rename's time in the memory directory's file system, then
# (given BENCH_UPDATE) bench_update's update in place / out of place / over the gradients,
# then ROUNDS rounds of runs in turn: off (the baseline), memory_every = 1, and, given
# BASELINE (another build's strata, say the commit before a change), memory_every = 1 with
# that build. ms a step from each run's `done` event. (Until cc5a4cc a third arm made every
# rename a no-op by an LD_PRELOAD shim; the update's generations keep their names since.)
#
#   benchmarks/memory_update_cost.sh STRATA DATA.h5 [CONFIG] (env: ROUNDS=5 STEPS=3000
#       MEMORY_ROOT=/dev/shm BENCH_UPDATE=build/benchmarks/bench_update BASELINE=other/strata)
#
# Used for RESULTS.md run 13 (the H200 machine's 16-core host) as build/diag/diag.sh.
set -euo pipefail
STRATA=$1 DATA=$2 CONFIG=${3:-$(dirname "$0")/../configs/fmnist_mlp.toml}
ROUNDS=${ROUNDS:-5} STEPS=${STEPS:-3000} ROOT=${MEMORY_ROOT:-/dev/shm}
T=$(mktemp -d); trap 'rm -rf "$T" "$ROOT"/strata-update-cost-*' EXIT
cat >"$T/rename.c" <<'C'
#include <stdio.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>
int main(int argc, char** argv) {
  char a[4096], b[4096];
  snprintf(a, sizeof a, "%s/a", argv[1]);
  snprintf(b, sizeof b, "%s/b", argv[1]);
  close(open(a, O_CREAT | O_RDWR, 0600));
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 0; i < 20000; i++) { rename(a, b); rename(b, a); }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  printf("%.2f us per rename\n", ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 40000 / 1e3);
  unlink(a);
  return 0;
}
C
cc -O2 -o "$T/rename" "$T/rename.c"
date -u; lscpu | grep -E "Model name|^CPU\(s\)" || true
mkdir -p "$ROOT/strata-update-cost-r"
echo "== a rename in $ROOT"; "$T/rename" "$ROOT/strata-update-cost-r"
if [ -n "${BENCH_UPDATE:-}" ]; then echo "== $BENCH_UPDATE 30"; "$BENCH_UPDATE" 30; fi
ARMS="off on${BASELINE:+ baseline}"
echo "== ${STEPS} steps, 1 rank, --threads 1: off / memory_every 1${BASELINE:+ / memory_every 1 with $BASELINE} (ms a step)"
for r in $(seq "$ROUNDS"); do
  for arm in $ARMS; do
    args=() bin=$STRATA
    [ $arm != off ] && args=(--checkpoint.memory_every 1 --checkpoint.memory_dir "$ROOT/strata-update-cost-%n")
    [ $arm = baseline ] && bin=$BASELINE
    rm -rf "$T/out" "$ROOT"/strata-update-cost-[!r]*
    "$bin" train --config "$CONFIG" --data.path "$DATA" --train.max_steps "$STEPS" \
      --train.epochs 1000 --output.dir "$T/out" --progress off --checkpoint.final false --threads 1 \
      --device cpu "${args[@]}" >"$T/log" 2>&1 || { tail -3 "$T/log"; exit 1; }
    python3 -c "import json,sys; d=[json.loads(l) for l in open(sys.argv[1]) if '\"done\"' in l][-1]; \
print(sys.argv[2], round(1e3 * d['train_time_s'] / d['step'], 4), end='  ')" "$T/out/metrics.jsonl" $arm \
      | tee -a "$T/times"
  done
  echo
done
python3 - "$T/times" <<'PY'
import statistics, sys
words = open(sys.argv[1]).read().split()
ms = {}
for arm, t in zip(words[::2], words[1::2]):
    ms.setdefault(arm, []).append(float(t))
off = statistics.median(ms["off"])
print("medians: " + ", ".join(f"{a} {statistics.median(v):.4f} ms" + ("" if a == "off" else f" ({100 * (statistics.median(v) / off - 1):+.1f} %)")
                             for a, v in ms.items()))
PY
