#!/usr/bin/env bash
# Trains a shipped config on 2 ranks, as the README's demo does, and checks the test accuracy
# that strata reports in its metrics "done" line against a published-baseline floor.
# Usage: accuracy.sh STRATA CONFIG DATA.h5 WORKDIR MIN_ACCURACY
set -euo pipefail
strata=$1 config=$2 data=$3 work=$4 floor=$5
rm -rf "$work" && mkdir -p "$work"
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  mpirun -n 2 --oversubscribe --bind-to none "$strata" train --config "$config" \
  --data.path "$data" --output.dir "$work" --progress lines
acc=$(/usr/bin/python3 -c 'import json,sys; print([json.loads(l) for l in open(sys.argv[1])][-1]["test_accuracy"])' "$work/metrics.jsonl")
# The parameter file must give the same accuracy through `strata eval`.
evaljson=$("$strata" eval --checkpoint "$work/model.h5" --data "$data" --json)
eacc=$(/usr/bin/python3 -c 'import json,sys; print(json.loads(sys.argv[1])["accuracy"])' "$evaljson")
echo "$(basename "$config"): test accuracy $acc (strata eval: $eacc), floor $floor"
/usr/bin/python3 -c 'import sys; a,e,f=map(float,sys.argv[1:]); sys.exit(0 if a>=f and abs(a-e)<1e-9 else 1)' "$acc" "$eacc" "$floor"
