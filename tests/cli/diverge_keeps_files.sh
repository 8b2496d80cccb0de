#!/usr/bin/env bash
# A NaN/Inf loss stops training with exit 3 naming the step, and replaces nothing already
# written: an existing parameter file and earlier metrics lines stay as they were.
set -euo pipefail
strata=$1 data=$2 out=$3
rm -rf "$out" && mkdir -p "$out"
echo "parameters of an earlier run" > "$out/model.h5"
echo '{"earlier": "line"}' > "$out/metrics.jsonl"
"$(dirname "$0")/expect_error.sh" 3 'step [0-9]+: loss is (NaN|Inf)' \
  "$strata" train --data.path "$data" --train.lr 1e8 --train.max_steps 300 --output.dir "$out" --quiet
[ "$(cat "$out/model.h5")" = "parameters of an earlier run" ] || { echo "FAIL: model.h5 was overwritten"; exit 1; }
head -n1 "$out/metrics.jsonl" | grep -q '"earlier"' || { echo "FAIL: earlier metrics lost"; exit 1; }
ls "$out" | grep -q tmp && { echo "FAIL: temporary file left behind"; exit 1; }
echo "ok: existing files untouched"
