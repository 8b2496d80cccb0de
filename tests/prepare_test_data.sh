#!/usr/bin/env bash
# Prepares Fashion-MNIST once for the test suite (reused when the file is already there).
set -euo pipefail
strata=$1 out=$2
[ -s "$out" ] && exit 0
mkdir -p "$(dirname "$out")"
"$strata" prepare fashion-mnist --out "$out"
