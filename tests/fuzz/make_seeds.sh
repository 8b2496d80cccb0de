#!/usr/bin/env bash
# Writes the fuzzers' seed corpora into DIR/{config,dataset,checkpoint}: small valid files of
# each kind, written by strata itself where it can write them, and the TOML dictionary.
#   tests/fuzz/make_seeds.sh STRATA DIR
set -euo pipefail
strata=$(realpath "$1")
out=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
py=/usr/bin/python3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$out"/config "$out"/dataset "$out"/checkpoint "$out"/work
work=$out/work

# Datasets: images (uint8 and float32, with a test split), and a token file.
"$py" - "$out/dataset" <<'PY'
import sys, h5py, numpy as np
d = sys.argv[1]
rng = np.random.default_rng(0)
for name, dtype in (("u8", np.uint8), ("f32", np.float32)):
    img = (rng.integers(0, 255, (8, 4, 4)) if dtype == np.uint8 else rng.random((8, 4, 4))).astype(dtype)
    with h5py.File(f"{d}/images_{name}.h5", "w") as f:
        f["train/images"] = img
        f["train/labels"] = rng.integers(0, 4, 8).astype(np.uint8)
        f["test/images"] = img[:4]
        f["test/labels"] = rng.integers(0, 4, 4).astype(np.uint8)
        f.attrs["classes"] = 4
with h5py.File(f"{d}/tokens_small.h5", "w") as f:
    f.attrs["kind"] = "tokens"
    f.attrs["vocab"] = 16
    f["train/tokens"] = rng.integers(0, 16, 64).astype(np.uint8)
    f["val/tokens"] = rng.integers(0, 16, 32).astype(np.uint8)
PY
head -c 12000 "$src/README.md" > "$work/text.txt"
"$strata" prepare text --input "$work/text.txt" --out "$out/dataset/tokens_prepared.h5" > /dev/null

# Checkpoints and parameter files of a tiny model, written by strata.
"$strata" train --data.path "$out/dataset/images_u8.h5" --model.type custom \
  --model.layers flatten "linear 4" --train.batch_size 4 --train.max_steps 2 \
  --checkpoint.every_steps 1 --output.dir "$work/run" --quiet > /dev/null
cp "$work/run/model.h5" "$out/checkpoint/params.h5"
cp "$work/run/checkpoints/ckpt-000000002.h5" "$out/checkpoint/ckpt.h5"
"$strata" train --data.path "$out/dataset/tokens_small.h5" --model.type gpt --model.layers 1 \
  --model.heads 1 --model.dim 4 --model.context 8 --train.batch_size 2 --train.max_steps 1 \
  --output.dir "$work/gpt" --quiet > /dev/null
cp "$work/gpt/model.h5" "$out/checkpoint/gpt_params.h5"

# Configs: the shipped ones, the tests', and an effective config strata stored.
cp "$src"/configs/*.toml "$src"/tests/cli/*.toml "$out/config/"
"$py" -c 'import h5py, sys; print(h5py.File(sys.argv[1])["/"].attrs["config"])' \
  "$work/run/model.h5" > "$out/config/effective.toml"
rm -rf "$work"

# The dictionary: every section and key strata knows, and TOML's punctuation.
{
  for w in '[' ']' '[[' ']]' '=' '"' "'" '"""' "'''" '{' '}' ',' '.' '#' 'true' 'false' \
           'inf' 'nan' '-inf' '+inf' '0x' '0o' '0b' '1e' '_' '\\u' '\\U' '\\n'; do
    printf '"%s"\n' "$(printf '%s' "$w" | sed 's/\\/\\\\/g; s/"/\\"/g')"
  done
  "$strata" train --help | sed -n 's/^ *--\([a-z0-9_]*\)\.\([a-z0-9_]*\).*/\1 \2/p' | sort -u |
    while read -r section key; do printf '"[%s]"\n"%s"\n' "$section" "$key"; done | sort -u
} > "$out/config.dict"
echo "seeds in $out: $(ls "$out/config" | wc -l) configs, $(ls "$out/dataset" | wc -l) datasets, $(ls "$out/checkpoint" | wc -l) checkpoints"
