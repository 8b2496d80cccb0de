#!/usr/bin/env bash
# Runs one libFuzzer harness with its seeds, in a memory cgroup, and keeps its corpus.
#   tests/fuzz/run.sh HARNESS [SECONDS] [BUILD_DIR] [LIBFUZZER FLAGS...]
# HARNESS: config | dataset | checkpoint. SECONDS: default 600. BUILD_DIR: default build-fuzz,
# configured (if it is not) with clang and -DSTRATA_FUZZ=ON, and the plain build in `build`
# for the seeds. Findings (crash-*, leak-*, timeout-*, oom-*) land in WORK/findings; the corpus
# grows in WORK/corpus (WORK: build-fuzz/fuzz-HARNESS).
#
# Memory: strata refuses what cannot fit in the memory it may use, which includes its cgroup's
# limit; the harness runs in a cgroup of 1.5 GiB (v1 or v2, where this machine allows one) so
# that strata's own checks, not libFuzzer's 2 GiB malloc limit, decide what is too large.
set -euo pipefail
harness=${1:?usage: run.sh config|dataset|checkpoint [SECONDS] [BUILD_DIR]}
seconds=${2:-600}
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$(realpath -m "${3:-$src/build-fuzz}")
shift $(( $# < 3 ? $# : 3 ))  # what is left goes to libFuzzer (e.g. -fork=1 -ignore_timeouts=1)
case $harness in config|dataset|checkpoint) ;; *) echo "run.sh: unknown harness $harness" >&2; exit 2 ;; esac

if [ ! -f "$build/CMakeCache.txt" ]; then
  CC=clang CXX=clang++ cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_FUZZ=ON >/dev/null
fi
cmake --build "$build" -j "$(nproc)" --target "fuzz_$harness"  # up to date with the source
seeds=$build/fuzz-seeds
[ -d "$seeds/$harness" ] || "$src/tests/fuzz/make_seeds.sh" "$src/build/strata" "$seeds"
work=$build/fuzz-$harness
mkdir -p "$work/corpus" "$work/findings"

# A memory cgroup for this run (best effort: where none can be made, libFuzzer's limits alone).
cg=""
limit=$((1536 << 20))
if [ -w /sys/fs/cgroup/cgroup.subtree_control ] 2>/dev/null; then
  cg=/sys/fs/cgroup/strata-fuzz-$$
  mkdir "$cg" && echo "$limit" >"$cg/memory.max"
else
  v1=/sys/fs/cgroup/memory$(sed -n 's/^[0-9]*:memory://p' /proc/self/cgroup)
  if [ -w "$v1" ]; then
    cg=$v1/strata-fuzz-$$
    mkdir "$cg" && echo "$limit" >"$cg/memory.limit_in_bytes"
  fi
fi
cleanup() { [ -n "$cg" ] && rmdir "$cg" 2>/dev/null || true; }
trap cleanup EXIT

dict=()
[ "$harness" = config ] && dict=(-dict="$seeds/config.dict")
cmd=("$build/tests/fuzz/fuzz_$harness" "$work/corpus" "$seeds/$harness" "${dict[@]}"
     -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=2048 -timeout=20
     -max_len=65536 -print_final_stats=1 -artifact_prefix="$work/findings/" "$@")
export LSAN_OPTIONS="suppressions=$src/tests/fuzz/lsan.supp:print_suppressions=0"
# HDF5 asks malloc for what a damaged size field says (petabytes): a plain build gets NULL and
# HDF5 an error that strata reports (exit 2); ASan would abort on the request itself instead.
export ASAN_OPTIONS="allocator_may_return_null=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
echo "run.sh: ${cmd[*]}${cg:+ (in cgroup $cg, $((limit >> 20)) MiB)}"
if [ -n "$cg" ]; then
  bash -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' _ "$cg" "${cmd[@]}"
else
  "${cmd[@]}"
fi
