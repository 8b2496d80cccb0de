#!/usr/bin/env bash
# singletons_side_by_side.sh STRATA CONFIG: strata started without mpirun, 8 at a time, 20 each
# (as a job script's `strata prepare` beside another's `strata inspect`): every start succeeds
# and leaves no MPI session folder behind. Open MPI gives every isolated singleton job id 0,
# so they used to race for one session folder and some failed to start.
set -u
strata=$1 config=$2
tmp=$(mktemp -d)
export TMPDIR=$tmp
fails=$tmp/fails
one_loop() {
  for _ in $(seq 20); do
    out=$("$strata" config --get train.lr --config "$config" 2>&1) || echo "exit $?: $out" >>"$fails"
  done
}
for _ in 1 2 3 4 5 6 7 8; do one_loop & done
wait
left=$(find "$tmp" -mindepth 1 -maxdepth 1 -name 'strata-mpi.*' | wc -l)
if [ -s "$fails" ] || [ "$left" -ne 0 ]; then
  echo "FAIL: $(grep -c '^exit' "$fails" 2>/dev/null || echo 0) of 160 starts failed; $left session folders left"
  head -n 20 "$fails" 2>/dev/null
  rm -rf "$tmp"
  exit 1
fi
echo "ok: 160 starts, 8 at a time, none failed, no session folder left"
rm -rf "$tmp"
