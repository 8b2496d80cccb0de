#!/usr/bin/env bash
# A relocatable bundle of a strata build: one .tar.gz that, unpacked anywhere, runs on a Linux
# x86-64 node holding glibc, libstdc++ and libgcc and nothing else of strata's dependencies.
#
#   packaging/bundle.sh BUILD_DIR OUT_DIR [--with-checks]
#
# writes OUT_DIR/strata-VERSION-COMMIT-linux-x86_64.tar.gz (-checks.tar.gz with the GPU
# check, its test programs and benchmarks: bin/strata-gpu-check) and prints its size. Inside:
#   bin/strata, bin/mpirun, bin/mpiexec   packaging/bundle_launcher.c: point the bundled Open
#                                         MPI at the bundle, then run libexec/<same name>
#   bin/orted                             Open MPI's daemon (a singleton MPI_Init starts one)
#   libexec/strata, libexec/mpirun        the real programs
#   lib/                                  every shared library they need (ldd), RPATH $ORIGIN
#   lib/strata/libstrata_cuda.so          the CUDA backend module; the CUDA libraries are NOT
#                                         bundled: strata finds the node's (docs/gpus.md)
#   lib/<arch>/openmpi, lib/<arch>/pmix2  Open MPI's and PMIx's components, share/openmpi,
#   etc/openmpi                           help texts and Debian's MCA defaults
#   share/strata, share/doc/strata        configs, Slurm scripts, the modulefile, the docs
# Every ELF file gets an RPATH (DT_RPATH, which LD_LIBRARY_PATH cannot override) relative to
# $ORIGIN, so another MPI or HDF5 on the node's library path is never mixed in.
# Open MPI components left out: UCX, verbs and OFI (Debian's own MCA defaults disable them:
# shared memory within a node, TCP between nodes; NCCL carries the GPUs' allreduces), and
# OpenSHMEM and PSM (strata uses neither). The plain bundle must stay under 30 MiB.
# Needs the build machine's tools: cmake, cc, ldd, patchelf, strip, ompi_info, tar, gzip.
set -euo pipefail
[ $# -ge 2 ] || { sed -n '4,6p' "$0" >&2; exit 2; }
build=$(cd "$1" && pwd) out=$2 checks=${3:-}
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ -z "$checks" ] || [ "$checks" = --with-checks ] || { echo "bundle.sh: unknown option $checks" >&2; exit 2; }
limit_mib=30

fail() { echo "bundle.sh: error: $*" >&2; exit 1; }
for tool in cmake cc ldd patchelf strip ompi_info tar gzip; do
  command -v "$tool" >/dev/null || fail "needs $tool"
done
[ -x "$build/strata" ] || fail "no $build/strata (build first)"

# "strata 0.1.0 (3d7141d0a1b2)": the version and commit compiled into this build.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
read -r _ version commit < <("$build/strata" --version)
commit=${commit//[()]/}
name=strata-$version-$commit-linux-x86_64${checks:+-checks}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
root=$tmp/$name

# ---- strata's own files: the installation, bin/strata moved to libexec ---------------------
cmake --install "$build" --prefix "$root" >/dev/null
if [ -n "$checks" ]; then
  cmake --install "$build" --prefix "$root" --component checks >/dev/null
  [ -x "$root/bin/strata-gpu-check" ] || fail "--with-checks: $build has no GPU check (built without the CUDA backend)"
fi
mkdir -p "$root/libexec"
mv "$root/bin/strata" "$root/libexec/strata"

# ---- Open MPI: its programs, components, help texts and defaults, from where it lives ----
ompi_path() { ompi_info --parsable --path all | sed -n "s|^path:$1:||p" | head -n 1; }
prefix=$(ompi_path prefix) bindir=$(ompi_path bindir) pkglibdir=$(ompi_path pkglibdir)
pkgdatadir=$(ompi_path pkgdatadir) sysconfdir=$(ompi_path sysconfdir)
for d in "$pkglibdir" "$pkgdatadir"; do
  [[ $d == "$prefix"/* ]] || fail "Open MPI's $d is outside its prefix $prefix: cannot relocate"
done
cp "$bindir/orterun" "$root/libexec/mpirun"
cp "$bindir/orted" "$root/bin/orted"
mkdir -p "$root/${pkglibdir#"$prefix"/}" "$root/${pkgdatadir#"$prefix"/}" "$root/etc/openmpi"
for c in "$pkglibdir"/mca_*.so; do
  case ${c##*/} in
    *ucx* | mca_btl_openib.so | mca_btl_ofi.so | mca_mtl_* | mca_atomic_* | mca_memheap_* | \
      mca_scoll_* | mca_spml_* | mca_sshmem_*) continue ;;
  esac
  cp "$c" "$root/${pkglibdir#"$prefix"/}/"
done
cp -r "$pkgdatadir/." "$root/${pkgdatadir#"$prefix"/}/"
cp "$sysconfdir/openmpi-mca-params.conf" "$root/etc/openmpi/"
# PMIx, through the component that loads it: its prefix holds lib/pmix (components) and share.
pmix_lib=$(ldd "$pkglibdir"/mca_pmix_*.so | awk '$1 ~ /^libpmix\.so/ { print $3; exit }')
[ -n "$pmix_lib" ] || fail "no libpmix found by Open MPI's pmix component"
pmix_prefix=$(dirname "$(dirname "$(readlink -f "$pmix_lib")")")
[[ $pmix_prefix == "$prefix"/* ]] || fail "PMIx's $pmix_prefix is outside $prefix"
pmix_rel=${pmix_prefix#"$prefix"/}
mkdir -p "$root/$pmix_rel/lib"
cp -r "$pmix_prefix/lib/pmix" "$root/$pmix_rel/lib/"
cp -r "$pmix_prefix/share" "$root/$pmix_rel/"
# Debian's names its component directory by absolute path (/usr/...): left out, PMIx takes
# the one the launcher sets.
rm -f "$root/$pmix_rel/share/pmix-mca-params.conf"

# ---- The launcher, under each name that needs the environment -----------------------------
cc -O2 -Wall -Wextra -Werror -DPMIX_DIR="\"$pmix_rel\"" -o "$root/bin/strata" \
  "$src/packaging/bundle_launcher.c"
for n in bin/mpirun bin/mpiexec libexec/no-remote-shell; do cp "$root/bin/strata" "$root/$n"; done

# ---- Shared libraries: the ldd closure of every ELF file, less what the node provides -----
# glibc's, libstdc++ and libgcc (every Linux node has them) and the CUDA libraries (the
# node's own, found at run time).
node_provides() {
  case $1 in
    ld-linux-x86-64.so.2 | libc.so.6 | libm.so.6 | libmvec.so.1 | libpthread.so.0 | libdl.so.2 | \
      librt.so.1 | libresolv.so.2 | libutil.so.1 | libanl.so.1 | libnsl.so.1 | libnss_*.so.2 | \
      libBrokenLocale.so.1 | libthread_db.so.1 | libstdc++.so.6 | libgcc_s.so.1) return 0 ;;
    libcuda.so.* | libcudart.so.* | libcublas.so.* | libcublasLt.so.* | libcudnn*.so.* | \
      libnccl.so.* | libnvrtc*.so.* | libnvJitLink.so.*) return 0 ;;
  esac
  return 1
}
mapfile -t elves < <(find "$root" -type f \( -name '*.so' -o -perm -u+x \))
mkdir -p "$root/lib"
for f in "${elves[@]}"; do
  head -c 4 "$f" | grep -q ELF || continue
  while read -r soname arrow path _; do
    [ "$arrow" = "=>" ] || continue
    node_provides "$soname" && continue
    [ "$path" != "not" ] || fail "${f#"$root"/} needs $soname, which this machine lacks"
    [ -e "$root/lib/$soname" ] || cp -L "$path" "$root/lib/$soname"
  done < <(ldd "$f")
done

# ---- Our binaries stripped; every ELF file's RPATH relative to $ORIGIN ----------------------
ours=("$root/libexec/strata")
[ ! -d "$root/lib/strata" ] || ours+=("$root"/lib/strata/*.so)  # CUDA builds: the module
[ -z "$checks" ] || ours+=("$root"/libexec/strata-checks/*)
strip --strip-unneeded "${ours[@]}"
while IFS= read -r f; do
  head -c 4 "$f" | grep -q ELF || continue
  case $f in
    "$root"/bin/strata | "$root"/bin/mpi* | "$root"/libexec/no-remote-shell) ;;  # the launcher: libc only
    *) rel=$(realpath --relative-to="$(dirname "$f")" "$root/lib")
       rpath=\$ORIGIN
       [ "$rel" = . ] || rpath=$rpath/$rel
       patchelf --force-rpath --set-rpath "$rpath" "$f" ;;
  esac
done < <(find "$root" -type f)
cp "$root/libexec/mpirun" "$root/libexec/mpiexec"

# ---- The archive ---------------------------------------------------------------------------
mkdir -p "$out"
tarball=$(cd "$out" && pwd)/$name.tar.gz
tar -C "$tmp" --sort=name --owner=0 --group=0 --numeric-owner -cf - "$name" | gzip -9 >"$tarball"
bytes=$(stat -c %s "$tarball")
unpacked=$(du -sb "$root" | cut -f1)
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
echo "$tarball: $(mib "$bytes") compressed ($bytes bytes), $(mib "$unpacked") unpacked"
if [ -z "$checks" ] && ((bytes > limit_mib * 1048576)); then
  fail "$name.tar.gz is $(mib "$bytes"), over the $limit_mib MiB limit"
fi
