#!/usr/bin/env bash
# Writes a small synthetic dataset in Fashion-MNIST's IDX layout, for nodes without the real
# one (the bundle's GPU check, the install and bundle tests): OUTDIR/{train,t10k}-{images-idx3,
# labels-idx1}-ubyte.gz, which `strata prepare fashion-mnist --source OUTDIR` converts.
#
#   make_synthetic_idx.sh OUTDIR [TRAIN_SAMPLES (4096)] [TEST_SAMPLES (1024)]
#
# Sample i has label i mod 10 and a 28x28 image of deterministic noise (a linear congruential
# generator) with a bright band of rows 2*label+4 .. 2*label+5: learnable, so that accuracy
# rises above chance, and the same bytes on every machine. Needs bash, awk and gzip only.
set -euo pipefail
[ $# -ge 1 ] || { sed -n '5p' "$0" >&2; exit 2; }
out=$1 train=${2:-4096} test=${3:-1024}
mkdir -p "$out"

# bytes V...: each value 0..255 as one byte (printf %b's \0NNN octal escapes).
bytes() {
  local v
  for v in "$@"; do printf '%b' "\\0$(printf %03o "$v")"; done
}

# header DIMS N [ROWS COLS]: the IDX header of unsigned bytes, sizes big-endian.
header() {
  local v
  bytes 0 0 8 "$1"
  shift
  for v in "$@"; do bytes $((v >> 24 & 255)) $((v >> 16 & 255)) $((v >> 8 & 255)) $((v & 255)); done
}

# images N SEED: the pixel bytes. Values 1..255 only: awk's printf("%c", 0) is not portable.
images() {
  LC_ALL=C awk -v n="$1" -v seed="$2" 'BEGIN {
    x = seed
    for (i = 0; i < n; i++) {
      band = 2 * (i % 10) + 4
      for (r = 0; r < 28; r++) {
        row = ""
        for (c = 0; c < 28; c++) {
          x = (x * 1103515245 + 12345) % 2147483648
          v = 1 + int(x / 2147483648 * 80)
          if (r == band || r == band + 1) v += 160
          row = row sprintf("%c", v)
        }
        printf "%s", row
      }
    }
  }'
}

# labels N: i mod 10 as bytes.
labels() {
  local i s=""
  for ((i = 0; i < $1; i++)); do s+="\\00$((i % 10 / 8))$((i % 10 % 8))"; done
  printf '%b' "$s"
}

write() {  # prefix samples seed
  { header 3 "$2" 28 28; images "$2" "$3"; } | gzip -n >"$out/$1-images-idx3-ubyte.gz"
  { header 1 "$2"; labels "$2"; } | gzip -n >"$out/$1-labels-idx1-ubyte.gz"
}
write train "$train" 1
write t10k "$test" 2
