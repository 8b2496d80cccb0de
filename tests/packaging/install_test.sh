#!/usr/bin/env bash
# strata installed with `cmake --install` into a prefix outside the source tree, then used
# from elsewhere with the source and build trees out of reach.
#
#   install_test.sh install|run|module|gpu-check|clean SOURCE_DIR BUILD_DIR PREFIX
#   install    cmake --install (and the checks component, in CUDA builds) into PREFIX; the
#              GNUInstallDirs layout is there, and no installed file names the source or build
#              directory (a compiled-in path would make the installation depend on them)
#   run        from a directory outside both trees, with both hidden under empty tmpfs mounts
#              in a private mount namespace (root; elsewhere they are only not the cwd):
#              strata prepare on a synthetic IDX set, train with the installed config, eval
#   module     `module load strata` (Lmod) from the installed modulefile: PATH, STRATA_ROOT,
#              STRATA, STRATA_SBATCH point into PREFIX; skipped (77) where Lmod is absent
#   gpu-check  the installed bin/strata-gpu-check on this node: where no GPU is visible every
#              GPU part is skipped with the reason and the CPU parts pass, exit 0
#   clean      removes PREFIX
set -euo pipefail
mode=$1 src=$2 build=$3 prefix=$4
fail() { echo "FAIL: $*"; exit 1; }
skip() { echo "skipped: $*"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$prefix.work

case $mode in
  install)
    rm -rf "$prefix" "$work"
    cmake --install "$build" --prefix "$prefix" >/dev/null
    cuda=no
    if [ -e "$build/strata-gpu-check" ]; then
      cmake --install "$build" --prefix "$prefix" --component checks >/dev/null
      cuda=yes
    fi
    version=$("$build/strata" --version | awk '{ print $2 }')
    for f in bin/strata share/strata/configs/fmnist_mlp.toml share/strata/slurm/train.sbatch \
             share/strata/slurm/train-gpu.sbatch share/doc/strata/README.md \
             share/doc/strata/docs/configuration.md \
             "share/strata/modulefiles/strata/$version.lua"; do
      [ -e "$prefix/$f" ] || fail "not installed: $f"
    done
    if [ $cuda = yes ]; then
      for f in lib/strata/libstrata_cuda.so bin/strata-gpu-check libexec/strata-checks/strata_op_tests \
               libexec/strata-checks/bench_cuda_ops share/strata/checks/train_follows_cpu.sh; do
        [ -e "$prefix/$f" ] || fail "not installed: $f"
      done
      readelf -d "$prefix/bin/strata" | grep -qE "R(UN)?PATH.*\\\$ORIGIN/\.\./lib" ||
        fail "bin/strata's RPATH does not name \$ORIGIN/../lib: $(readelf -d "$prefix/bin/strata" | grep PATH)"
    fi
    # No installed file may name the trees it came from (grep reads binaries as text).
    hits=$(grep -rlaF -e "$src" -e "$build" "$prefix" || true)
    [ -z "$hits" ] || fail "installed files name the source or build directory: $hits"
    echo "ok: installed into $prefix ($(du -sh "$prefix" | cut -f1), CUDA module: $cuda); no file names $src or $build"
    ;;

  run)
    rm -rf "$work"
    mkdir -p "$work/cwd"
    "$src/tests/make_synthetic_idx.sh" "$work/idx" 1024 256
    hidden=no
    if [ "$(id -u)" = 0 ] && command -v unshare >/dev/null && unshare --mount true 2>/dev/null; then
      hidden=yes
    fi
    # The same steps, in the namespace with the trees hidden, or plainly.
    # shellcheck disable=SC2016  # expanded by the inner bash
    steps='
      set -euo pipefail
      if [ "$1" = yes ]; then
        mount --make-rprivate /
        # The build tree may lie inside the source tree: hidden with it then.
        for d in "$4" "$5"; do
          [ ! -d "$d" ] || mount -t tmpfs -o size=1m,mode=0555 strata-hidden "$d"
        done
        [ -z "$(ls -A "$4")" ] || { echo "FAIL: $4 still visible"; exit 1; }
      fi
      cd "$3/cwd"
      "$2/bin/strata" prepare fashion-mnist --source "$3/idx" --out data.h5
      "$2/bin/strata" train --config "$2/share/strata/configs/fmnist_mlp.toml" --data.path data.h5 \
        --train.max_steps 48 --output.dir run --progress lines
      "$2/bin/strata" eval --checkpoint run/model.h5 --data data.h5 --json > eval.json
      cat eval.json'
    if [ $hidden = yes ]; then
      out=$(unshare --mount bash -c "$steps" steps yes "$prefix" "$work" "$src" "$build" 2>&1) ||
        fail "$(printf 'in a namespace hiding %s and %s:\n%s' "$src" "$build" "$out")"
    else
      out=$(bash -c "$steps" steps no "$prefix" "$work" "$src" "$build" 2>&1) || fail "$out"
    fi
    printf '%s\n' "$out"
    # The synthetic set is learnable (a bright band per class): well above chance (0.1).
    awk '/^\{"accuracy"/ { a = $2 + 0; ok = a > 0.3 } END { exit !ok }' "$work/cwd/eval.json" ||
      fail "accuracy $(cat "$work/cwd/eval.json") is not above 0.3"
    if [ $hidden = yes ]; then
      echo "ok: trained and evaluated from $work/cwd with $src and $build hidden"
    else
      echo "ok: trained and evaluated from $work/cwd (the trees were not hidden: needs root and unshare)"
    fi
    ;;

  module)
    init=""
    for f in /usr/share/lmod/lmod/init/bash /etc/profile.d/lmod.sh; do
      [ -r "$f" ] && { init=$f; break; }
    done
    [ -n "$init" ] || skip "Lmod is not installed (Debian: apt-get install lmod)"
    # shellcheck disable=SC2016  # expanded by the inner bash
    out=$(env -u STRATA -u STRATA_ROOT -u STRATA_SBATCH bash -c '
      source "$1" >/dev/null 2>&1
      module use "$2/share/strata/modulefiles"
      module load strata
      printf "strata=%s\nroot=%s\nSTRATA=%s\nSTRATA_SBATCH=%s\n" "$(command -v strata)" \
        "$STRATA_ROOT" "$STRATA" "$STRATA_SBATCH"
      strata --version' bash "$init" "$prefix" 2>&1) || fail "module load: $out"
    printf '%s\n' "$out"
    expect=$(printf 'strata=%s/bin/strata\nroot=%s\nSTRATA=%s/bin/strata\nSTRATA_SBATCH=%s/share/strata/slurm/train.sbatch' \
             "$prefix" "$prefix" "$prefix" "$prefix")
    [ "$(head -n 4 <<<"$out")" = "$expect" ] || fail "the module set other paths; expected:"$'\n'"$expect"
    grep -q "^strata [0-9]" <<<"$out" || fail "strata --version after module load"
    echo "ok: module load strata sets PATH and the variables to $prefix"
    ;;

  gpu-check)
    [ -x "$prefix/bin/strata-gpu-check" ] || skip "a build without the CUDA backend has no GPU check"
    rm -rf "$work/gpu-check"
    mkdir -p "$work/gpu-check"
    cd "$work/gpu-check"
    rc=0
    out=$("$prefix/bin/strata-gpu-check" results.txt 2>&1) || rc=$?
    printf '%s\n' "$out"
    [ -s results.txt ] || fail "no results file"
    if ! grep -q '^cuda: no GPU' <("$prefix/bin/strata" devices); then
      skip "this node has a GPU: the check ran for real (exit $rc, results in $PWD/results.txt)"
    fi
    ((rc == 0)) || fail "exit $rc on a node without a GPU"
    summary=$(sed -n '/^parts:/,/^$/p' results.txt)
    gpu_parts=$(grep -cE "^skipped +(cuda|training|GEMM).*\(no GPU: " <<<"$summary" || true)
    [ "$(grep -c '^passed' <<<"$summary")" = 2 ] || fail "expected the 2 CPU parts passed"$'\n'"$summary"
    [ "$gpu_parts" = 18 ] || fail "expected the 18 GPU parts skipped with the reason"$'\n'"$summary"
    ! grep -q '^failed' <<<"$summary" || fail "a part failed"$'\n'"$summary"
    echo "ok: CPU parts passed, $gpu_parts GPU parts skipped with the reason, exit 0"
    # A node whose driver shows a GPU that strata cannot use (faked): every GPU part fails with
    # the reason, and the check exits non-zero.
    rc=0
    STRATA_GPU_CHECK_DRIVER_GPU="GPU 0: faked for the install test" \
      "$prefix/bin/strata-gpu-check" faked.txt >faked.log 2>&1 || rc=$?
    ((rc != 0)) || fail "a GPU the driver shows but strata cannot use: exit 0"$'\n'"$(cat faked.log)"
    summary=$(sed -n '/^parts:/,/^$/p' faked.txt)
    gpu_parts=$(grep -cE "^failed +(cuda|training|GEMM).*\(no GPU: " <<<"$summary" || true)
    [ "$gpu_parts" = 18 ] || fail "faked GPU: expected the 18 GPU parts failed with the reason"$'\n'"$summary"
    echo "ok: with a GPU the driver shows, the $gpu_parts GPU parts fail with the reason, exit $rc"
    ;;

  clean)
    rm -rf "$prefix" "$work"
    ;;
  *) fail "unknown mode $mode" ;;
esac
