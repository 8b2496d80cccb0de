#!/usr/bin/env bash
# The bundle in an empty root: a chroot holding only the unpacked bundle and the files of
# glibc, libstdc++ and libgcc (Debian's packages libc6, libstdc++6, libgcc-s1), with /proc and
# /sys mounted (the launcher reads /proc/self/exe, hwloc reads /sys). There, with a clean
# environment and no shell, it runs strata --version, strata prepare on an IDX set made here,
# a 1-rank training as an MPI singleton, a 2-rank training under the bundle's mpirun, eval and
# inspect of its output, --device cuda (no CUDA library exists there: exit 2, one line) and
# strata devices. Every library any process loads (LD_DEBUG=libs: orted, mpirun, the ranks)
# must come from the bundle or from those three packages; no Open MPI or PMIx help-file
# complaint may appear (they mean a path that did not move with the bundle).
#
#   bundle_hermetic.sh BUNDLE_DIR MAKE_IDX WORK
# BUNDLE_DIR holds the strata-*-linux-x86_64.tar.gz to test (the newest); MAKE_IDX is
# tests/make_synthetic_idx.sh. Exits 77 (skipped) where no such root can be made: not root,
# no chroot or dpkg, or mounts refused.
set -euo pipefail
bundle_dir=$1 make_idx=$2 work=$3
skip() { echo "skipped: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

[ "$(id -u)" = 0 ] || skip "building a chroot needs root (CI runs as root)"
chroot_bin=$(command -v chroot) || skip "no chroot program"
command -v dpkg >/dev/null || skip "no dpkg: cannot tell glibc's, libstdc++'s and libgcc's files"
tarball=$(find "$bundle_dir" -maxdepth 1 -name 'strata-*-linux-x86_64.tar.gz' -printf '%T@ %p\n' 2>/dev/null |
          sort -rn | head -n 1 | cut -d' ' -f2-)
[ -n "$tarball" ] || fail "no bundle in $bundle_dir"

root=$work/root
cleanup() {
  for m in proc sys; do mountpoint -q "$root/$m" && umount "$root/$m"; done
  rm -rf "$root"
}
mkdir -p "$work"
for m in proc sys; do mountpoint -q "$root/$m" 2>/dev/null && umount "$root/$m"; done
rm -rf "$root"
trap cleanup EXIT
mkdir -p "$root"/{opt,data,proc,sys,usr/lib,usr/lib64,tmp/ld}
chmod 1777 "$root/tmp"
# Debian's merged /usr: /lib, /lib64, /bin are links into usr/.
for d in lib lib64 bin sbin; do
  [ -L "/$d" ] && ln -s "$(readlink "/$d")" "$root/$d"
done
# The three packages' files, each at its real place (symlinks kept: libstdc++.so.6 -> ...).
allowed=$work/allowed
: >"$allowed"
while IFS= read -r f; do
  { [ -f "$f" ] || [ -L "$f" ]; } || continue
  dir=$(readlink -f "$(dirname "$f")")
  mkdir -p "$root$dir"
  cp -a "$f" "$root$dir/"
  echo "$dir/$(basename "$f")" >>"$allowed"
done < <(dpkg -L libc6 libstdc++6 libgcc-s1)
"$chroot_bin" "$root" /lib64/ld-linux-x86-64.so.2 --version >/dev/null 2>&1 || skip "cannot chroot here"

tar -C "$root/opt" -xzf "$tarball"
name=$(basename "$tarball" .tar.gz)
B=/opt/$name
[ -x "$root$B/bin/strata" ] || fail "$tarball does not unpack to $name/bin/strata"
"$make_idx" "$root/data/idx" 512 128
echo "root: $root: $(du -sh "$root" | cut -f1) (bundle $(du -sh "$root$B" | cut -f1)); bundle $tarball"
mount -t proc proc "$root/proc" || skip "cannot mount /proc in the root"
mount -t sysfs sysfs "$root/sys" || skip "cannot mount /sys in the root"

# step NAME EXPECTED_STATUS REGEX CMD...: runs CMD in the root (clean environment, LD_DEBUG
# into /tmp/ld) and checks its status and that its output matches REGEX.
step() {
  local what=$1 want=$2 regex=$3 out rc=0
  shift 3
  out=$(env -i PATH="$B/bin" HOME=/tmp OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        LD_DEBUG=libs LD_DEBUG_OUTPUT=/tmp/ld/log "$chroot_bin" "$root" "$@" 2>&1) || rc=$?
  if [ "$rc" != "$want" ] || ! grep -qE -- "$regex" <<<"$out" ||
     grep -qE "couldn't open the help file|internal error" <<<"$out"; then
    echo "FAIL: $what: exit $rc (expected $want), output (expected to match /$regex/):"
    printf '  | %s\n' "${out//$'\n'/$'\n'  | }"
    exit 1
  fi
  echo "ok: $what: $(grep -E -- "$regex" <<<"$out" | head -n 1)"
}

cfg=$B/share/strata/configs/fmnist_mlp.toml
train=(train --config "$cfg" --data.path /data/d.h5 --train.max_steps 20 --progress lines)
step "strata --version" 0 "^strata [0-9]" "$B/bin/strata" --version
step "strata prepare" 0 "^wrote /data/d.h5" "$B/bin/strata" prepare fashion-mnist --source /data/idx --out /data/d.h5
step "1-rank training, MPI singleton" 0 "1 rank, device cpu.*no GPU" "$B/bin/strata" "${train[@]}" --output.dir /runs/one
step "2-rank training, the bundle's mpirun" 0 "^done: 20 steps" \
  "$B/bin/mpirun" -n 2 --oversubscribe --bind-to none "$B/bin/strata" "${train[@]}" --output.dir /runs/two
step "strata eval" 0 '^\{"accuracy": [0-9.]+, "loss": [0-9.]+, "samples": 128, "precision": "fp32"\}' \
  "$B/bin/strata" eval --checkpoint /runs/two/model.h5 --data /data/d.h5 --json
step "strata inspect" 0 "all checksums verify" "$B/bin/strata" inspect /runs/two/model.h5
step "--device cuda without CUDA libraries" 2 \
  "^strata: error: --device cuda: .*no CUDA libraries: libcudart\.so\.[0-9]+.* not found in " \
  "$B/bin/strata" "${train[@]}" --output.dir /runs/cuda --device cuda
step "strata devices" 0 "^cuda: no GPU: " "$B/bin/strata" devices

# Every object loaded by any process (its real path in the root: LD_DEBUG prints
# $ORIGIN/../lib/... as found): from the bundle, or one of the three packages' files.
logs=("$root"/tmp/ld/log.*)
mapfile -t loaded < <(sed -n 's/.*calling init: //p' "${logs[@]}" | sort -u |
                      while IFS= read -r lib; do real=$(readlink -f "$root$lib"); echo "${real#"$root"}"; done | sort -u)
outside=()
for lib in "${loaded[@]}"; do
  case $lib in "$B"/*) continue ;; esac
  grep -qxF "$lib" "$allowed" || outside+=("$lib")
done
((${#outside[@]} == 0)) || fail "loaded from outside the bundle: ${outside[*]}"
# The check saw what matters: MPI, a component, HDF5 and oneDNN, from the bundle.
# Each process's log on a miss: its program, objects initialised, Open MPI components among them
# (a miss seen once in CI under load, not reproduced: this says which process lacked them).
per_process() {
  local log
  for log in "${logs[@]}"; do
    printf '  %s: %s, %d objects, %d mca_ components\n' "${log##*/}" \
      "$(sed -n 's/.*initialize program: //p' "$log" | head -n 1)" \
      "$(grep -c 'calling init: ' "$log")" "$(grep -c 'calling init: .*/mca_' "$log")"
  done
}
for want in "$B/lib/libmpi.so" "$B/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/mca_" \
            "$B/lib/libhdf5" "$B/lib/libdnnl.so"; do
  printf '%s\n' "${loaded[@]}" | grep -qF "$want" ||
    { per_process; fail "no process loaded $want* (LD_DEBUG saw ${#loaded[@]} objects in ${#logs[@]} logs)"; }
done
echo "ok: ${#logs[@]} processes loaded ${#loaded[@]} distinct objects, all from the bundle or glibc, libstdc++, libgcc"
