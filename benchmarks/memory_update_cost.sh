#!/usr/bin/env bash
# Where the step cost of memory checkpoints written by the optimizer's update goes (issue 33),
# on one rank of the MLP: the update's out-of-place stores against the renames of the
# generation files. Prints a rename's time in the memory directory's file system, then (given
# BENCH_UPDATE) bench_update's update in place / out of place, then ROUNDS rounds of three
# runs: off, memory_every = 1, and memory_every = 1 with every rename after the first four made
# a no-op by an LD_PRELOAD shim (the shim only measures: its files keep stale names). ms a step
# from each run's `done` event.
#
#   benchmarks/memory_update_cost.sh STRATA DATA.h5 [CONFIG] (env: ROUNDS=5 STEPS=3000
#       MEMORY_ROOT=/dev/shm BENCH_UPDATE=build/benchmarks/bench_update)
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
cat >"$T/norename.c" <<'C'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>
int rename(const char* a, const char* b) {
  static int (*real)(const char*, const char*);
  static int n;
  if (!real) real = (int (*)(const char*, const char*))dlsym(RTLD_NEXT, "rename");
  if (strstr(a, "/strata-update-cost-") && ++n > 4) return 0;
  return real(a, b);
}
C
cc -O2 -o "$T/rename" "$T/rename.c"
cc -O2 -shared -fPIC -o "$T/norename.so" "$T/norename.c" -ldl
date -u; lscpu | grep -E "Model name|^CPU\(s\)" || true
mkdir -p "$ROOT/strata-update-cost-r"
echo "== a rename in $ROOT"; "$T/rename" "$ROOT/strata-update-cost-r"
if [ -n "${BENCH_UPDATE:-}" ]; then echo "== $BENCH_UPDATE 30"; "$BENCH_UPDATE" 30; fi
echo "== ${STEPS} steps, 1 rank, --threads 1: off / memory_every 1 / memory_every 1 without renames (ms a step)"
for r in $(seq "$ROUNDS"); do
  for arm in off on norename; do
    args=() pre=""
    [ $arm != off ] && args=(--checkpoint.memory_every 1 --checkpoint.memory_dir "$ROOT/strata-update-cost-%n")
    [ $arm = norename ] && pre="$T/norename.so"
    rm -rf "$T/out" "$ROOT"/strata-update-cost-[!r]*
    LD_PRELOAD=$pre "$STRATA" train --config "$CONFIG" --data.path "$DATA" --train.max_steps "$STEPS" \
      --train.epochs 1000 --output.dir "$T/out" --progress off --checkpoint.final false --threads 1 \
      --device cpu "${args[@]}" >"$T/log" 2>&1 || { tail -3 "$T/log"; exit 1; }
    python3 -c "import json,sys; d=[json.loads(l) for l in open(sys.argv[1]) if '\"done\"' in l][-1]; \
print(sys.argv[2], round(1e3 * d['train_time_s'] / d['step'], 4), end='  ')" "$T/out/metrics.jsonl" $arm
  done
  echo
done
